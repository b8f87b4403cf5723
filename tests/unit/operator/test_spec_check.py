"""What keeps a spec from becoming pods, each problem naming its field: the node directory,
the local volume type, the name, the template's shape and its Pod Security level. None of
these raises, whatever the template holds."""

from __future__ import annotations

from typing import Any

import pytest
from operator_builders import TORCHRUN, spec

from stabletrain_operator import pods
from stabletrain_operator.api.constants import Reason
from stabletrain_operator.api.spec import LocalTierSpec, StableTrainingJobSpec
from stabletrain_operator.tenancy.hostnames import name_problems
from stabletrain_operator.tenancy.limits import (
    PodSecurityLevel,
    TenancySettings,
    parse_host_path_prefixes,
    parse_volume_types,
)
from stabletrain_operator.tenancy.local_tier import local_tier_problems
from stabletrain_operator.tenancy.spec_check import spec_problems

DEFAULTS = TenancySettings()
JOB = pods.JobRef("gpt", "team", "uid-1")
Json = dict[str, Any]


def local(**fields: Any) -> LocalTierSpec:
    return LocalTierSpec.model_validate(fields)


def job_spec(template: Json, **workers: Any) -> StableTrainingJobSpec:
    return spec(
        workers={"nodes": 2, "template": template, **workers},
        checkpoints={"local": {"hostPath": "/var/lib/stabletrain"}, "pfs": {"claimName": "pfs"}},
    )


def test_a_node_directory_must_be_one_the_cluster_allows() -> None:
    assert local_tier_problems(local(hostPath="/var/lib/stabletrain"), DEFAULTS) == []
    assert local_tier_problems(local(hostPath="/var/lib/stabletrain/"), DEFAULTS) == []
    for path in ("/etc", "/var/lib", "/var/lib/stabletrain/../../etc", "/var/lib/stabletrainx",
                 "/var/lib/stabletrain/mine"):  # fmt: skip
        (problem,) = local_tier_problems(LocalTierSpec.model_construct(host_path=path), DEFAULTS)
        assert problem.field == "spec.checkpoints.local.hostPath", path
        assert problem.reason is Reason.HOST_PATH_NOT_ALLOWED
    (root,) = local_tier_problems(LocalTierSpec.model_construct(host_path="/"), DEFAULTS)
    assert "root directory" in root.message
    none = TenancySettings(host_path_prefixes=())
    (refused,) = local_tier_problems(local(hostPath="/var/lib/stabletrain"), none)
    assert "allows no node directory" in refused.message


def test_the_schema_refuses_the_root_and_dot_segments_itself() -> None:
    for path in ("/", "/var/../etc", "/var/./x", "//x"):
        with pytest.raises(ValueError, match="directory below /"):
            local(hostPath=path)


def test_a_local_volume_must_be_one_source_of_an_allowed_type() -> None:
    assert local_tier_problems(local(volume={"emptyDir": {}}), DEFAULTS) == []
    cases = {
        "hostPath": {"hostPath": {"path": "/"}},
        "not allowed": {"nfs": {"server": "nfs", "path": "/"}},
        "exactly one": {"emptyDir": {}, "name": "mine"},
    }
    for expected, volume in cases.items():
        (problem,) = local_tier_problems(local(volume=volume), DEFAULTS)
        assert problem.field == "spec.checkpoints.local.volume"
        assert expected in problem.message, problem
    strict = TenancySettings(local_volume_types=frozenset({"nfs"}),
                             pod_security=PodSecurityLevel.RESTRICTED)  # fmt: skip
    (problem,) = local_tier_problems(local(volume=cases["not allowed"]), strict)
    assert problem.reason is Reason.POD_SECURITY


def test_the_settings_flags_name_a_bad_value() -> None:
    assert parse_host_path_prefixes("/mnt/nvme0, /mnt/nvme1/") == ("/mnt/nvme0", "/mnt/nvme1")
    assert parse_host_path_prefixes("") == ()
    for bad in ("/", "relative", "/mnt/../etc"):
        with pytest.raises(ValueError, match="cannot be a prefix"):
            parse_host_path_prefixes(bad)
    assert parse_volume_types("emptyDir,csi") == {"emptyDir", "csi"}
    with pytest.raises(ValueError, match="hostPath is not allowed here"):
        parse_volume_types("emptyDir,hostPath")
    with pytest.raises(ValueError, match="emptydir is not a core/v1 volume source"):
        parse_volume_types("emptydir")


def test_a_name_that_cannot_name_the_service_or_a_hostname_is_refused() -> None:
    for name in ("gpt.v2", "2gpt", "a" * 64):
        (problem,) = name_problems(name, nodes=2, attempt=0)
        assert (problem.field, problem.reason) == ("metadata.name", Reason.NAME_NOT_USABLE)
    long = "a" * 55
    assert name_problems(long, nodes=1000, attempt=9) == []
    (late,) = name_problems(long, nodes=1000, attempt=100)
    assert f"{long}-a100-999" in late.message
    assert "64 characters" in late.message
    assert name_problems("a" * 40, nodes=10_000, attempt=10**16 - 1) == []
    (preflight,) = name_problems(long, nodes=1, attempt=0, preflight_generation=1)
    assert "preflight" in preflight.message


MALFORMED: list[tuple[str, Json, Json, str]] = [
    ("env as a string", {"spec": {"containers": [{"name": "t", "env": "oops"}]}}, {},
     "spec.workers.template.spec.containers[0].env"),
    ("tolerations as a map", {"spec": {"containers": [{"name": "t"}],
                                       "tolerations": {"key": "gpu"}}}, {},
     "spec.workers.template.spec.tolerations"),
    ("labels as a string", {"metadata": {"labels": "team=nlp"},
                            "spec": {"containers": [{"name": "t"}]}}, {},
     "spec.workers.template.metadata.labels"),
    ("a wrong containerName", {"spec": {"containers": [{"name": "t"}]}},
     {"containerName": "trainer"}, "spec.workers.containerName"),
    ("an env entry without a name", {"spec": {"containers": [{"name": "t", "env": [{}]}]}}, {},
     "spec.workers.template.spec.containers[0].env[0].name"),
    ("affinity terms as a string",
     {"spec": {"containers": [{"name": "t"}], "affinity": {"nodeAffinity": {
         "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "x"}}}}}, {},
     "spec.workers.template.spec.affinity.nodeAffinity."
     "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "template", "workers", "field"), MALFORMED)
def test_a_malformed_template_names_its_field_instead_of_raising(
    what: str, template: Json, workers: Json, field: str
) -> None:
    """Each of these made pods.build_pod raise on every tick."""
    checked = spec_problems(job_spec(template, **workers), JOB, DEFAULTS, attempt=0)
    assert [p.field for p in checked.problems] == [field], what
    assert checked.problems[0].reason is Reason.MALFORMED_TEMPLATE
    assert checked.pod is None


def test_a_sound_spec_has_no_problem_and_yields_the_last_ranks_pod() -> None:
    template = {"spec": {"containers": [{"name": "t", "command": TORCHRUN}]}}
    checked = spec_problems(job_spec(template), JOB, DEFAULTS, attempt=3)
    assert checked.problems == ()
    assert checked.pod is not None
    assert checked.pod["metadata"]["name"] == "gpt-a3-1"


def test_pod_security_problems_name_the_template_field_and_the_level() -> None:
    template = {"spec": {"hostPID": True, "containers": [{"name": "t"}]}}
    (problem,) = spec_problems(job_spec(template), JOB, DEFAULTS, attempt=0).problems
    assert problem.field == "spec.workers.template.spec.hostPID"
    assert "baseline Pod Security level" in problem.message
