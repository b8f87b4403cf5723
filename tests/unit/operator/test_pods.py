"""Pod, Service and ConfigMap construction: what torchrun and the agent get from the pod."""

from __future__ import annotations

import json
from typing import Any

import pytest
from operator_builders import TORCHRUN, spec

from stabletrain_contract import env
from stabletrain_contract.directives import parse_directives
from stabletrain_operator import pods
from stabletrain_operator.observe.pod_facts import pod_facts
from stabletrain_operator.plan.sent_directives import attempt_directives, with_spec

JOB = pods.JobRef("gpt", "team", "uid-1")


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]
    }


def test_pod_carries_torchrun_settings_and_the_agent_contract() -> None:
    pod = pods.build_pod(spec(), JOB, attempt=3, rank=1)
    variables = _env(pod)
    assert pod["metadata"]["name"] == "gpt-a3-1"
    assert variables["PET_NNODES"] == "2"
    assert variables["PET_NODE_RANK"] == "1"
    assert variables["PET_RDZV_ID"] == "gpt-3"
    assert variables["PET_RDZV_ENDPOINT"] == "gpt-a3-0.gpt.team.svc:29400"
    assert variables["PET_RDZV_CONF"] == "join_timeout=900,is_host=0"
    assert variables["PET_LOCAL_ADDR"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert variables[env.ATTEMPT] == "3"
    assert variables[env.NODE_RANK] == "1"
    assert variables[env.NODE_NAME] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert variables[env.POD_NAME] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert variables[env.DIRECTIVES_TOKEN] == {
        "secretKeyRef": {"name": "gpt-token", "key": "token"}
    }
    assert variables[env.DIRECTIVES_PATH] == "/stabletrain/directives/directives.json"
    assert pod["spec"]["hostname"] == "gpt-a3-1"
    assert pod["spec"]["subdomain"] == "gpt"
    assert pod["spec"]["restartPolicy"] == "Never"
    labels = pod["metadata"]["labels"]
    assert labels == {
        "stabletrain.dev/job": "gpt",
        "stabletrain.dev/attempt": "3",
        "stabletrain.dev/rank": "1",
    }
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "StableTrainingJob",
        "uid-1",
        True,
    )
    container = pod["spec"]["containers"][0]
    assert container["terminationMessagePath"] == variables[env.TERMINATION_MESSAGE_PATH]
    assert container["ports"] == [{"name": "st-agent", "containerPort": 9400, "protocol": "TCP"}]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["stabletrain-local"]["hostPath"] == {
        "path": "/nvme/team/gpt",
        "type": "DirectoryOrCreate",
    }, "the job's own directory below the node directory its spec names"
    assert volumes["stabletrain-pfs"]["persistentVolumeClaim"] == {"claimName": "pfs"}
    assert volumes["stabletrain-directives"]["configMap"] == {"name": "gpt-a3-directives"}
    assert volumes["stabletrain-memory"]["emptyDir"] == {"medium": "Memory"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["stabletrain-local"] == variables[env.LOCAL_CHECKPOINT_DIR]
    assert mounts["stabletrain-pfs"] == variables[env.PFS_CHECKPOINT_DIR]
    assert mounts["stabletrain-memory"] == variables[env.MEMORY_CHECKPOINT_DIR]
    assert mounts["stabletrain-memory"].startswith(f"{pods.ROOT_DIR}/")
    assert "affinity" not in pod["spec"]
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_a_service_account_token_is_mounted_only_when_the_template_asks() -> None:
    container = {"name": "trainer", "command": TORCHRUN}
    template = {"spec": {"containers": [container], "automountServiceAccountToken": True}}
    pod = pods.build_pod(spec(workers={"nodes": 2, "template": template}), JOB, 0, 0)
    assert pod["spec"]["automountServiceAccountToken"] is True


def test_rank_zero_hosts_the_rendezvous_store() -> None:
    variables = _env(pods.build_pod(spec(), JOB, attempt=0, rank=0))
    assert variables["PET_RDZV_CONF"].endswith("is_host=1")


def test_relaunch_prefers_the_previous_node() -> None:
    pod = pods.build_pod(spec(), JOB, attempt=1, rank=0, previous_node="node-b")
    preferred = pod["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert preferred == [
        {
            "weight": 50,
            "preference": {
                "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-b"]}]
            },
        }
    ]


def test_user_env_and_template_survive_but_operator_values_win() -> None:
    container = {
        "name": "trainer",
        "command": ["torchrun", "train.py"],
        "env": [{"name": "MY_FLAG", "value": "1"}, {"name": "PET_NNODES", "value": "99"}],
    }
    template = {"metadata": {"labels": {"team": "nlp"}}, "spec": {"containers": [container]}}
    job = spec(workers={"nodes": 2, "template": template})
    pod = pods.build_pod(job, JOB, attempt=0, rank=0)
    variables = _env(pod)
    assert variables["MY_FLAG"] == "1"
    assert variables["PET_NNODES"] == "2"
    assert pod["metadata"]["labels"]["team"] == "nlp"
    assert pod["spec"]["containers"][0]["command"] == ["torchrun", "train.py"]
    assert template["spec"]["containers"][0]["env"][1]["value"] == "99", "template not mutated"


def test_unknown_container_name_is_an_error_that_names_the_containers() -> None:
    job = spec(workers={"nodes": 1, "containerName": "nope",
                        "template": {"spec": {"containers": [{"name": "trainer"}]}}})  # fmt: skip
    with pytest.raises(ValueError, match="trainer"):
        pods.build_pod(job, JOB, attempt=0, rank=0)


def test_service_is_headless_and_publishes_starting_pods() -> None:
    service = pods.build_service(JOB)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"stabletrain.dev/job": "gpt"}


def test_directives_config_map_round_trips() -> None:
    directives = attempt_directives(spec(), generation=4, attempt=2, resume_step=40,
                                    lr_scale=0.25, rewarmup_steps=10, skip=())  # fmt: skip
    config_map = pods.build_directives_config_map(JOB, directives)
    assert config_map["metadata"]["name"] == "gpt-a2-directives"
    read = parse_directives(config_map["data"][env.DIRECTIVES_FILE_KEY])
    # Left to what an older agent assumes: the default rules say no more than tripOn, and
    # the new pods' environment holds the checkpoint settings. The operator fills them back.
    assert (read.trip_rules, read.checkpoints) == (None, None)
    assert read == directives.model_copy(update={"trip_rules": None, "checkpoints": None})
    assert with_spec(read, spec()) == directives
    assert json.loads(config_map["data"][env.DIRECTIVES_FILE_KEY])["tripOn"] == [
        "NonFinite",
        "LossSpike",
    ]


def test_workers_on_a_lost_node_are_evicted_quickly_unless_the_template_says_otherwise() -> None:
    tolerations = pods.build_pod(spec(), JOB, attempt=0, rank=0)["spec"]["tolerations"]
    assert {(t["key"], t["tolerationSeconds"]) for t in tolerations} == {
        ("node.kubernetes.io/not-ready", 15),
        ("node.kubernetes.io/unreachable", 0),
    }
    own = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
    template = {"spec": {"containers": [{"name": "trainer"}], "tolerations": [own]}}
    pod = pods.build_pod(spec(workers={"nodes": 1, "template": template}), JOB, attempt=0, rank=0)
    assert pod["spec"]["tolerations"][0] == own
    assert [t["key"] for t in pod["spec"]["tolerations"]] == [
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/not-ready",
    ]


def test_pod_carries_the_checkpoint_settings_of_the_spec() -> None:
    checkpoints = {
        "local": {"hostPath": "/nvme", "retention": 4, "sizeLimit": "3Gi"},
        "pfs": {"claimName": "pfs", "retention": 6},
        "intervalSteps": 25,
        "spikeMarkers": 1,
    }
    checkpoints["memory"] = {"intervalSteps": 5}
    variables = _env(pods.build_pod(spec(checkpoints=checkpoints), JOB, attempt=0, rank=1))
    assert variables[env.CHECKPOINT_INTERVAL_STEPS] == "25"
    assert variables[env.MEMORY_INTERVAL_STEPS] == "5"
    assert variables[env.LOCAL_RETENTION] == "4"
    assert variables[env.PFS_RETENTION] == "6"
    assert variables[env.SPIKE_MARKERS] == "1"
    assert variables[env.LOCAL_SIZE_LIMIT_BYTES] == str(3 * 2**30)


def test_no_size_limit_means_no_size_variable_and_the_defaults_are_spelled_out() -> None:
    variables = _env(pods.build_pod(spec(), JOB, attempt=0, rank=0))
    assert env.LOCAL_SIZE_LIMIT_BYTES not in variables
    assert variables[env.CHECKPOINT_INTERVAL_STEPS] == str(env.DEFAULT_CHECKPOINT_INTERVAL_STEPS)
    assert variables[env.LOCAL_RETENTION] == variables[env.PFS_RETENTION] == "3"
    assert variables[env.SPIKE_MARKERS] == str(env.DEFAULT_SPIKE_MARKERS)
    assert variables[env.MEMORY_INTERVAL_STEPS] == str(env.DEFAULT_MEMORY_INTERVAL_STEPS)


def test_a_memory_interval_of_0_mounts_no_memory_tier() -> None:
    checkpoints = {"local": {"hostPath": "/nvme"}, "pfs": {"claimName": "pfs"},
                   "memory": {"intervalSteps": 0}}  # fmt: skip
    pod = pods.build_pod(spec(checkpoints=checkpoints), JOB, attempt=0, rank=0)
    variables = _env(pod)
    assert variables[env.MEMORY_INTERVAL_STEPS] == "0"
    assert env.MEMORY_CHECKPOINT_DIR not in variables
    assert "stabletrain-memory" not in {v["name"] for v in pod["spec"]["volumes"]}
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert "stabletrain-memory" not in {m["name"] for m in mounts}


def test_the_agent_port_setting_reaches_the_pod_the_service_and_the_scrape() -> None:
    pods.set_agent_port(9555)
    try:
        pod = pods.build_pod(spec(), JOB, attempt=0, rank=0)
        service = pods.build_service(JOB)
    finally:
        pods.set_agent_port(env.DEFAULT_AGENT_PORT)
    container = pod["spec"]["containers"][0]
    assert _env(pod)[env.AGENT_PORT] == "9555"
    assert {"name": "st-agent", "containerPort": 9555, "protocol": "TCP"} in container["ports"]
    assert service["spec"]["ports"] == [{"name": "st-agent", "port": 9555}]
    # A pod built before a change keeps its own port: the scrape asks the pod, not the setting.
    facts = pod_facts({**pod, "status": {"phase": "Running", "podIP": "10.0.0.7"}})
    assert facts is not None
    assert facts.agent_port == 9555
    assert pods.agent_url("10.0.0.7", facts.agent_port) == "http://10.0.0.7:9555"
    assert pods.agent_url("10.0.0.7") == f"http://10.0.0.7:{env.DEFAULT_AGENT_PORT}"
    with pytest.raises(ValueError, match=r"1\.\.65535"):
        pods.set_agent_port(0)


def test_a_local_volume_and_a_pfs_sub_path_are_what_the_pod_mounts() -> None:
    local = {"persistentVolumeClaim": {"claimName": "nvme-0"}}
    checkpoints = {"local": {"volume": local}, "pfs": {"claimName": "pfs", "subPath": "jobs/gpt"}}
    pod = pods.build_pod(spec(checkpoints=checkpoints), JOB, attempt=0, rank=0)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["stabletrain-local"] == {"name": "stabletrain-local", **local}
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["stabletrain-pfs"]["subPath"] == "jobs/gpt"
    assert "subPath" not in mounts["stabletrain-local"]


def test_every_attempts_directives_carry_the_specs_detection() -> None:
    detection = {"lossSpike": {"ratio": 2.5, "consecutiveSteps": 6}, "stallSeconds": 300}
    job = spec(detection=detection)
    directives = attempt_directives(job, generation=1, attempt=3, resume_step=40,
                                    lr_scale=0.5, rewarmup_steps=10, skip=())  # fmt: skip
    assert directives.detection == job.detection
    wire = json.loads(
        pods.build_directives_config_map(JOB, directives)["data"][env.DIRECTIVES_FILE_KEY]
    )
    assert wire["detection"]["lossSpike"]["ratio"] == 2.5
    assert wire["detection"]["lossSpike"]["consecutiveSteps"] == 6


def test_non_default_workers_and_rendezvous_settings_reach_torchrun() -> None:
    workers = {
        "nodes": 3,
        "processesPerNode": 4,
        "template": {"spec": {"containers": [{"name": "trainer", "command": ["torchrun"]}]}},
        "rendezvous": {"backend": "static", "port": 29555, "timeoutSeconds": 120},
    }
    variables = _env(pods.build_pod(spec(workers=workers), JOB, attempt=1, rank=2))
    assert (variables["PET_NNODES"], variables[env.NODES]) == ("3", "3")
    assert (variables["PET_NPROC_PER_NODE"], variables[env.PROCESSES_PER_NODE]) == ("4", "4")
    assert variables["PET_RDZV_BACKEND"] == "static"
    assert variables["PET_RDZV_ENDPOINT"] == "gpt-a1-0.gpt.team.svc:29555"
    assert variables["PET_MASTER_PORT"] == "29555"
    assert variables["PET_RDZV_CONF"] == "join_timeout=120", "static has no is_host"


def _in_place(**template: Any) -> Any:
    container = {"name": "trainer", "command": ["torchrun", "train.py"], **template}
    return spec(
        workers={"nodes": 2, "template": {"spec": {"containers": [container]}}},
        recovery={"restart": "InPlace"},
    )


def test_in_place_runs_the_command_under_the_supervisor_behind_the_agent_port() -> None:
    job = _in_place(args=["--steps", "9"])
    pod = pods.build_pod(job, JOB, attempt=4, rank=1, master_pod="gpt-a0-0")
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["stabletrain-supervisor", "--", "torchrun", "train.py"]
    assert container["args"] == ["--steps", "9"], "args still follow the command"
    variables = _env(pod)
    assert variables[env.AGENT_LOCAL_PORT] == "9401"
    assert variables[env.GRACE_SECONDS] == "30"
    assert variables[env.WARM_START] == "1"
    assert variables["PET_RDZV_ENDPOINT"] == "gpt-a0-0.gpt.team.svc:29400", "rank 0 kept"
    assert container["readinessProbe"]["httpGet"] == {"path": "/v1/ready", "port": "st-agent"}
    assert container["readinessProbe"]["periodSeconds"] == 1
    metadata = pod["metadata"]
    assert metadata["labels"]["stabletrain.dev/restart"] == "InPlace"
    assert metadata["annotations"]["stabletrain.dev/pod-shape"] == pods.pod_shape(job)
    facts = pod_facts({**pod, "status": {"phase": "Running"}})
    assert facts is not None
    assert (facts.supervised, facts.shape) == (True, pods.pod_shape(job))


def test_a_container_without_a_command_or_recreate_pods_runs_unwrapped() -> None:
    for job in (
        spec(workers={"template": {"spec": {"containers": [{"name": "t", "image": "x"}]}}},
             recovery={"restart": "InPlace"}),
        spec(recovery={"restart": "RecreatePods"}),
    ):  # fmt: skip
        assert not pods.supervised(job)
        container = pods.build_pod(job, JOB, attempt=0, rank=0)["spec"]["containers"][0]
        assert "readinessProbe" not in container
        assert container.get("command", ["x"])[0] != "stabletrain-supervisor"


def test_the_pod_shape_follows_the_fields_pods_are_built_from() -> None:
    base = _in_place()
    assert pods.pod_shape(base) == pods.pod_shape(_in_place())
    assert pods.pod_shape(base) != pods.pod_shape(_in_place(env=[{"name": "A", "value": "1"}]))
    edited = base.model_copy(update={"suspend": True})
    assert pods.pod_shape(edited) == pods.pod_shape(base), "not a pod-shaping field"
    cold = base.model_copy(
        update={"recovery": base.recovery.model_copy(update={"warm_start": False})}
    )
    assert pods.pod_shape(cold) != pods.pod_shape(base)
    checkpoints = base.checkpoints
    live = base.model_copy(
        update={
            "checkpoints": checkpoints.model_copy(
                update={
                    "interval_steps": 7,
                    "spike_markers": 5,
                    "local": checkpoints.local.model_copy(update={"retention": 9}),
                }
            )
        }
    )
    assert pods.pod_shape(live) == pods.pod_shape(base), "every attempt's directives carry them"
    memory = base.model_copy(
        update={
            "checkpoints": checkpoints.model_copy(
                update={"memory": checkpoints.memory.model_copy(update={"interval_steps": 0})}
            )
        }
    )
    assert pods.pod_shape(memory) != pods.pod_shape(base), "the pod's volume and environment"


def test_a_start_order_carries_the_attempts_rendezvous_through_the_kept_rank_0() -> None:
    job = _in_place()
    directives = attempt_directives(
        job, generation=3, attempt=2, resume_step=50, lr_scale=1.0, rewarmup_steps=0, skip=()
    )
    order = pods.start_order(job, JOB, directives, "gpt-a0-0")
    assert order.rendezvous_endpoint == "gpt-a0-0.gpt.team.svc:29400"
    assert (order.rendezvous_id, order.master_addr) == ("gpt-2", "gpt-a0-0.gpt.team.svc")
    assert order.directives == directives
    assert order.grace_seconds == 30
