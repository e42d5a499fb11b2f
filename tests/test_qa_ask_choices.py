"""What qa-ask and the hub choose for the user, said and switchable: --top-k answers that share no token (overlapping
ones on request), the layers in float32 whatever precision the checkpoint was trained in (bfloat16 on request, as
qa-predict), and --jsonl input that holds no question or a field no one reads is named, not passed over."""

import json
import shutil

import pytest
import torch

from fairseq_clusterformer.qa.model import ClusterFormerQAModel
from tests.conftest import run_ok
from tests.test_qa_ask import ask, odd, qa_data, records  # noqa: F401 (fixtures)
from tests.test_qa_end_to_end import TRAIN

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def bf16_checkpoint(qa_data, tmp_path_factory):  # noqa: F811
    save_dir = tmp_path_factory.mktemp("qa_ask_bf16")
    run_ok("fairseq-train", qa_data, *TRAIN, "--max-update", "30", "--save-dir", save_dir, "--autocast-bf16")
    return save_dir / "checkpoint_last.pt"


def layer_precision(hub) -> set[bool]:
    return {module.bf16_layers for module in hub.model.modules() if hasattr(module, "bf16_layers")}


def overlap(a, b) -> bool:
    return a.start < b.end and b.start < a.end


def test_top_answers_share_no_token_unless_overlapping_ones_are_asked_for(bf16_checkpoint, records):  # noqa: F811
    hub = ClusterFormerQAModel.from_pretrained(str(bf16_checkpoint), cpu=True)
    crowded = 0
    for n, record in enumerate(records[:8]):
        question, context = record["question"], odd(record, n)[1]
        distinct = hub.answer(question, context, top_k=5)
        assert [a.score for a in distinct] == sorted((a.score for a in distinct), reverse=True)
        assert distinct[0] == hub.answer(question, context)[0]
        assert not any(overlap(a, b) for i, a in enumerate(distinct) for b in distinct[i + 1 :])
        overlapping = hub.answer(question, context, top_k=5, overlapping=True)
        crowded += any(overlap(a, b) for i, a in enumerate(overlapping) for b in overlapping[i + 1 :])
    assert crowded, "the best spans never overlapped: the test shows nothing"


def test_the_hub_and_qa_ask_score_in_float32_unless_bfloat16_is_asked_for(bf16_checkpoint, records):  # noqa: F811
    default = ClusterFormerQAModel.from_pretrained(str(bf16_checkpoint), cpu=True)
    asked = ClusterFormerQAModel.from_pretrained(str(bf16_checkpoint), cpu=True, autocast_bf16=True)
    assert layer_precision(default) == {False} and layer_precision(asked) == {True}
    context = "\n\n".join(records[0]["paragraphs"])
    for hub, flags in ((default, []), (asked, ["--autocast-bf16"])):
        best = hub.answer(records[0]["question"], context)[0]
        code, out, err = ask("--path", bf16_checkpoint, "--question", records[0]["question"], "--context", "-",
                             *flags, stdin=context)  # fmt: skip
        assert code == 0 and f"score: {best.score:.4f}" in out, (out, err)


def test_jsonl_without_questions_or_with_unread_fields_is_named(bf16_checkpoint, records, tmp_path):  # noqa: F811
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    code, out, err = ask("--path", bf16_checkpoint, "--jsonl", empty)
    assert code == 1 and not out and f"--jsonl {empty}: no question in it (empty, or blank lines only)" in err, err
    code, out, err = ask("--path", bf16_checkpoint, "--jsonl", "-", stdin="")
    assert code == 1 and "--jsonl standard input: no question in it" in err, err
    line = {"question": records[0]["question"], "context": "\n\n".join(records[0]["paragraphs"]), "top_k": 5}
    path = tmp_path / "extra.jsonl"
    path.write_text(json.dumps(line) + "\n")
    code, out, err = ask("--path", bf16_checkpoint, "--jsonl", path)
    assert code == 1 and json.loads(out) == {"line": 1, "error": json.loads(out)["error"]}
    assert f'{path}:1: unknown field(s) "top_k": a line holds "question", "context", "id"' in err, err


def test_from_pretrained_takes_the_last_checkpoint_of_a_run_that_never_validated(bf16_checkpoint, tmp_path):
    # the CPU recipes run with --disable-validation: their folders hold checkpoint_last.pt and no checkpoint_best.pt
    neither = f"no checkpoint {tmp_path}/checkpoint_best.pt or {tmp_path}/checkpoint_last.pt"
    with pytest.raises(FileNotFoundError, match=neither):
        ClusterFormerQAModel.from_pretrained(str(tmp_path), cpu=True)
    shutil.copy(bf16_checkpoint, tmp_path / "checkpoint_last.pt")
    hub = ClusterFormerQAModel.from_pretrained(str(tmp_path), cpu=True)
    assert hub.answer("what ?", "the secret word is amber .")


def test_a_checkpoint_trained_with_fp16_is_scored_in_bfloat16_when_asked(bf16_checkpoint, tmp_path):
    # --fp16 in the checkpoint's config was its training's flag, not this command line's: no conflict to refuse
    state = torch.load(bf16_checkpoint, map_location="cpu", weights_only=False)
    state["cfg"]["common"]["fp16"] = True
    torch.save(state, tmp_path / "checkpoint_last.pt")
    hub = ClusterFormerQAModel.from_pretrained(str(tmp_path), cpu=True, autocast_bf16=True)
    assert layer_precision(hub) == {True}
