"""The job's checkpoint key: made with its token Secret, handed to every pod by reference,
and optional, so that a job whose Secret predates signing keeps running unsigned."""

from __future__ import annotations

from operator_builders import spec

from stabletrain_contract import env
from stabletrain_contract.channel import new_token
from stabletrain_operator import naming, pods

JOB = pods.JobRef("gpt", "team", "uid-1")


def test_the_token_secret_holds_the_token_and_the_checkpoint_key() -> None:
    token, key = new_token(), new_token()
    secret = pods.build_token_secret(JOB, token, checkpoint_key=key)
    assert secret["metadata"]["name"] == naming.token_secret("gpt")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1", "it goes with the job"
    assert secret["stringData"] == {env.TOKEN_SECRET_KEY: token, env.CHECKPOINT_KEY_SECRET_KEY: key}


def test_every_pod_reads_the_key_from_the_secret_and_starts_without_one() -> None:
    pod = pods.build_pod(spec(), JOB, attempt=2, rank=1)
    variables = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    reference = variables[env.CHECKPOINT_KEY]["valueFrom"]["secretKeyRef"]
    assert reference == {
        "name": naming.token_secret("gpt"),
        "key": env.CHECKPOINT_KEY_SECRET_KEY,
        "optional": True,
    }
    assert "value" not in variables[env.CHECKPOINT_KEY], "never in the pod spec itself"
