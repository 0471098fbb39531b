"""An ``hf`` model from the offline claim (opt-in: needs torch and transformers).

Not part of the default run (``-m 'not torch'`` in pyproject's addopts;
``-m torch`` selects it, and then it fails, never skips, without torch):
torch from PyPI is a 539 MB wheel that pulls about 2.3 GB of CUDA libraries
(2.8 GB downloaded, measured for torch 2.15.0, see README "Tests"), so the
project's install does not carry it. It needs torch and transformers
importable, e.g. installed into a directory of their own and put on
PYTHONPATH (the local runner's containers get the test process's PYTHONPATH
after this checkout's driver)::

    pip install --target /tmp/torchsite torch transformers accelerate peft
    PYTHONPATH=$PWD:/tmp/torchsite python -m pytest -m torch tests/e2e/test_offline_hf_model.py

A tiny GPT-2 with random weights and a byte-level BPE tokenizer trained here
is saved with ``save_pretrained`` as a plain directory on the claim (beside
the hub cache holding ``allenai/ai2_arc``); the job names it with
``pretrained=/cache/storage/models/tiny-gpt2`` and evaluates ``arc_easy``
offline with ``--model hf``.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.runner import LocalRunner

from poller.cycle.reconciler import Reconciler
from tests.e2e.conftest import sample, submit
from tests.e2e.test_offline_storage import LMEVAL_TIMEOUT, static_claim
from tests.hubcache import ARC_ROWS, tree_state, write_arc_easy
from tests.poller_fixtures import Jobs, cycle_until

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.lmeval,
    pytest.mark.torch,  # deselected by default (pyproject addopts); `-m torch` selects it
]

NEEDS = ("torch", "transformers", "accelerate")


def _tiny_gpt2(directory: Path) -> None:
    """A 2-layer GPT-2 with random weights and a locally trained byte-level tokenizer."""
    import tokenizers
    import transformers

    bpe = tokenizers.ByteLevelBPETokenizer()
    corpus = [row[1] + " " + " ".join(row[2]) for rows in ARC_ROWS.values() for row in rows]
    bpe.train_from_iterator(corpus * 20, vocab_size=300, min_frequency=1)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )
    tokenizer.add_special_tokens({"eos_token": "<|endoftext|>"})
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=256,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    transformers.set_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def test_hf_model_and_dataset_from_the_claim_offline(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    tmp_path: Path,
) -> None:
    missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    assert not missing, f"-m torch needs {', '.join(missing)}: see this module's docstring"
    storage = tmp_path / "storage"
    write_arc_easy(storage / "hub")
    _tiny_gpt2(storage / "models" / "tiny-gpt2")
    before = tree_state(storage)
    static_claim(admin_api, jobs.namespace, "hf-models", storage)

    _, served = sample("served-model")
    job = copy.deepcopy(served)
    job["metadata"]["name"] = "hf-offline"
    job["spec"]["model"] = "hf"
    job["spec"]["modelArgs"] = [
        {"name": "pretrained", "value": "/cache/storage/models/tiny-gpt2"},
        {"name": "dtype", "value": "float32"},
    ]
    job["spec"]["tasks"] = ["arc_easy"]
    job["spec"]["batchSize"] = "1"
    del job["spec"]["customTasks"]
    job["spec"]["offline"] = {"storage": {"pvcName": "hf-models"}}
    submit(admin_api, jobs.namespace, job)

    def complete() -> dict[str, Any] | None:
        status = jobs.status("hf-offline")
        return status if status.get("state") == "Complete" else None

    final = cycle_until(poller, complete, timeout=LMEVAL_TIMEOUT, what="hf-offline Complete")
    assert final["reason"] == "Succeeded", final.get("message")
    results = json.loads(final["results"])
    assert set(results["results"]) == {"arc_easy"}
    assert results["n-samples"]["arc_easy"]["effective"] == len(ARC_ROWS["test"])
    # The local runner shows the pod's path as its host path; the tail is the pod's.
    pretrained = results["config"]["model_args"]["pretrained"]
    assert pretrained.endswith("/cache/storage/models/tiny-gpt2"), pretrained
    assert tree_state(storage) == before
