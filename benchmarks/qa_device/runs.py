"""The runs of the device call: table b (whole articles; none, cluster, lsh, sparse x seeds) and table a's GPU re-run
(paragraphs, sliding windows only), their settings and the commands of their three stages (train, predict, reach).

Settings are examples/qa/cpu_pretrained.sh's with table a's learning rate and UPDATES=700, so that a GPU row and a
CPU row differ only in the machine and the precision (bf16 autocast on the GPU); ``tiny`` is the CPU dry run's.

Variants (``--kinds``): the paper's replacement layers at 5, 6 (``none``, ``cluster``, ``lsh``, ``sparse``: the first
call's runs, whose settings, and so their committed results, stay as they were), the hybrid layers at 5, 6
(``--long-range-mode hybrid``: ``cluster-hybrid``, ``lsh-hybrid``, ``sparse-hybrid``), one Cluster-Former layer
(``cluster-layer6``, ``cluster-layer5``), its control, one sparse layer (``sparse-layer6``: far keys at fixed
positions, chosen without looking at their content), and one LSH layer (``lsh-layer6``: far keys by content, through
random rotations instead of trained centroids). The default plan is the one-layer series (``cluster-layer6``,
``lsh-layer6``, ``sparse-layer6``, ``cluster-layer5``) with ``none`` beside them: the committed ``none`` rows have the
same settings, so they are reused, not run again. Every Cluster-Former and LSH run is measured by qa-reach, and every
new Cluster-Former run by benchmarks/qa_cluster_ablation.py (its clusters as trained, shuffled, and the identity
order), both on the first REACH_QUESTIONS held-out questions, before the call's checkpoints are removed.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from fairseq_clusterformer.layers.kinds import KINDS as LAYER_KINDS

# variant -> (--long-range-layer, --long-range-mode, --long-range-layers): the runs this series made or may make, named
# as their result folders are (the kinds themselves are layers/kinds.py's)
VARIANTS = {
    "none": ("none", "replace", "5,6"),
    "cluster": ("cluster", "replace", "5,6"),
    "lsh": ("lsh", "replace", "5,6"),
    "sparse": ("sparse", "replace", "5,6"),
    "cluster-hybrid": ("cluster", "hybrid", "5,6"),
    "lsh-hybrid": ("lsh", "hybrid", "5,6"),
    "sparse-hybrid": ("sparse", "hybrid", "5,6"),
    "cluster-layer6": ("cluster", "replace", "6"),
    "cluster-layer5": ("cluster", "replace", "5"),
    "sparse-layer6": ("sparse", "replace", "6"),
    "lsh-layer6": ("lsh", "replace", "6"),
}
KINDS = tuple(VARIANTS)
DEFAULT_KINDS = "none,cluster-layer6,lsh-layer6,sparse-layer6,cluster-layer5"
# fairseq-clusterformer-qa-reach's mechanism statistic: where the far keys of the content-grouped kinds lie
REACH_KINDS = tuple(name for name, kind in LAYER_KINDS.items() if kind.grouped)
# benchmarks/qa_cluster_ablation.py: do the trained clusters answer, or did the layer only help training?
ABLATION_KINDS = tuple(name for name, kind in LAYER_KINDS.items() if kind.uses_clusters)
# qa-reach and the ablation on the first N held-out questions (a fixed subset: the split's order), so that they fit
# beside the runs; recorded in the new variants' settings (the first call's runs never reached either)
REACH_QUESTIONS = 300
REPO = Path(__file__).resolve().parent.parent.parent

COMMON = dict(updates=700, lr=1e-4, warmup=70, batch=16, max_sentences=16, max_question=40, max_context_eval=12000,
              clusters=64, kmeans_interval=200, memory=50000, long_range_layers="5,6", dropout=0.1,
              precision="autocast-bf16", predict_batch=8)  # fmt: skip
CONTEXTS = {
    "article": dict(window=256, stride=224, max_context_train=2048),
    "paragraph": dict(window=192, stride=160, max_context_train=512),
}
# the dry run: a tiny BERT of 128 positions on three short articles, a few updates on the CPU
TINY = dict(updates=3, warmup=1, batch=4, max_sentences=4, max_question=60, clusters=4, kmeans_interval=2,
            memory=2000, predict_batch=4)  # fmt: skip
TINY_CONTEXTS = dict(window=48, stride=40, max_context_train=256)


@dataclass(frozen=True)
class Run:
    contexts: str  # article (table b) or paragraph (table a)
    variant: str  # a key of VARIANTS
    seed: int

    @property
    def name(self) -> str:
        return f"{self.contexts}_{self.variant}_seed{self.seed}"  # cpu_pretrained.sh's run names

    @property
    def kind(self) -> str:
        return VARIANTS[self.variant][0]

    @property
    def mode(self) -> str:
        return VARIANTS[self.variant][1]

    @property
    def reach(self) -> bool:
        """Whether qa-reach measures it: every Cluster-Former and LSH run."""
        return self.kind in REACH_KINDS

    @property
    def ablation(self) -> bool:
        """Whether benchmarks/qa_cluster_ablation.py scores it: the Cluster-Former runs after the first call's."""
        return self.kind in ABLATION_KINDS and self.variant != self.kind

    @property
    def measured(self) -> bool:
        """Whether anything runs beside its qa-predict (qa-reach, the ablation)."""
        return self.reach or self.ablation

    def settings(self, tiny: bool) -> dict:
        """Everything that makes two runs of this name the same experiment (a finished run is reused only when its
        summary.json holds these). The paper's variants keep the first call's keys; the others add theirs."""
        out = {**COMMON, **CONTEXTS[self.contexts], "kind": self.kind, "seed": self.seed}
        if self.variant != self.kind:
            layers = VARIANTS[self.variant][2]
            out.update(variant=self.variant, long_range_mode=self.mode, long_range_layers=layers)
            if self.reach:  # the first call's cluster runs keep their settings: their summaries say what ran
                out["reach_questions"] = REACH_QUESTIONS
            if self.ablation:
                out["ablation_questions"] = REACH_QUESTIONS
        if tiny:
            out.update(TINY, **TINY_CONTEXTS, tiny=True)
        return out


def plan(seeds: list[int], kinds: list[str], table_a: bool) -> list[Run]:
    """The runs in priority order: table b by seed (all kinds of seed 1 first), then table a's re-run."""
    for kind in kinds:
        if kind not in VARIANTS:
            raise ValueError(f"--kinds: {kind!r} is not one of {', '.join(VARIANTS)}")
    runs = [Run("article", kind, seed) for seed in seeds for kind in kinds]
    return runs + ([Run("paragraph", "none", seed) for seed in seeds] if table_a else [])


@dataclass(frozen=True)
class Paths:
    data: Path  # the unpacked payload: squad_article/, squad_paragraph/
    encoder: Path
    work: Path  # checkpoints and logs of this call
    results: Path  # finished runs' folders (committed between calls)

    def data_bin(self, run: Run) -> Path:
        return self.data / f"squad_{run.contexts}"

    def checkpoint(self, run: Run) -> Path:
        return self.work / run.name / "checkpoint_last.pt"


def train_command(run: Run, paths: Paths, tiny: bool, threads: int) -> tuple[list[str], dict[str, str]]:
    """examples/qa/train.sh (it prints the full fairseq-train command) with the run's settings."""
    s = run.settings(tiny)
    env = dict(ARCH="clusterformer_qa_base", ROBERTA=str(paths.encoder), LONG_RANGE=run.kind, WINDOW=s["window"],
               STRIDE=s["stride"], MAX_QUESTION=s["max_question"], BATCH=s["batch"], MAX_SENTENCES=s["max_sentences"],
               LR=s["lr"], WARMUP=s["warmup"], UPDATES=s["updates"], MAX_CONTEXT_TRAIN=s["max_context_train"],
               MAX_CONTEXT_EVAL=s["max_context_eval"], CLUSTERS=s["clusters"], KMEANS_INTERVAL=s["kmeans_interval"],
               MEMORY=s["memory"], DROPOUT=s["dropout"], SEED=run.seed, SAVE_DIR=str(paths.work / run.name),
               OMP_NUM_THREADS=threads)  # fmt: skip
    command = ["bash", str(REPO / "examples/qa/train.sh"), str(paths.data_bin(run)),
               "--long-range-layers", s["long_range_layers"], "--long-range-mode", run.mode,
               "--disable-validation", "--autocast-bf16",
               "--log-interval", "1" if tiny else "10", "--save-interval", "1000"]  # fmt: skip
    return command + (["--cpu"] if tiny else []), {k: str(v) for k, v in env.items()}


def predict_command(run: Run, paths: Paths, tiny: bool, output: Path) -> list[str]:
    """fairseq-clusterformer-qa-predict on every held-out question, whole contexts, in float32."""
    command = [sys.executable, "-m", "fairseq_clusterformer.qa.scripts.predict", str(paths.data_bin(run)),
               "--path", str(paths.checkpoint(run)), "--split", "valid", "--output", str(output),
               "--batch-size", str(run.settings(tiny)["predict_batch"])]  # fmt: skip
    return command + (["--cpu"] if tiny else [])


def reach_command(run: Run, paths: Paths, tiny: bool, output: Path) -> list[str]:
    """fairseq-clusterformer-qa-reach on the first REACH_QUESTIONS held-out questions (``reach_questions``)."""
    command = [sys.executable, "-m", "fairseq_clusterformer.qa.scripts.reach", str(paths.data_bin(run)),
               "--path", str(paths.checkpoint(run)), "--split", "valid", "--json", str(output),
               "--max-examples", str(run.settings(tiny).get("reach_questions", REACH_QUESTIONS))]  # fmt: skip
    return command + (["--cpu"] if tiny else [])


def ablation_command(run: Run, paths: Paths, tiny: bool, output: Path) -> list[str]:
    """benchmarks/qa_cluster_ablation.py on the same questions as qa-reach, in float32 as qa-predict scores."""
    command = [sys.executable, "-m", "benchmarks.qa_cluster_ablation", str(paths.data_bin(run)),
               "--path", str(paths.checkpoint(run)), "--split", "valid", "--json", str(output),
               "--max-examples", str(run.settings(tiny)["ablation_questions"])]  # fmt: skip
    return command + (["--cpu"] if tiny else [])


def measure_command(run: Run, paths: Paths, tiny: bool, folder: Path) -> list[str]:
    """What runs beside the run's qa-predict: qa-reach, then the ablation, one after the other in one process
    group (a stop ends both); each writes its JSON and its log into ``folder``."""
    steps = []
    if run.reach:
        steps.append((reach_command(run, paths, tiny, folder / "reach.json"), folder / "reach.log"))
    if run.ablation:
        steps.append((ablation_command(run, paths, tiny, folder / "cluster_ablation.json"),
                      folder / "cluster_ablation.log"))  # fmt: skip
    # each step runs whatever the one before it did (a failed qa-reach still leaves the ablation its time); the
    # stage's status says whether every JSON file was written
    script = [f"{shlex.join(command)} > {shlex.quote(str(log))} 2>&1" for command, log in steps]
    script += [" && ".join(f"test -s {shlex.quote(str(folder / name))}" for name in outputs(run))]
    return ["bash", "-c", "; ".join(script)]


def outputs(run: Run) -> list[str]:
    """The JSON files the measuring stage leaves."""
    return (["reach.json"] if run.reach else []) + (["cluster_ablation.json"] if run.ablation else [])
