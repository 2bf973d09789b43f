"""The chain of chapters, in order: one definition shared by the book runner and the evidence summary."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChapterSpec:
    name: str        # the chapter's name in the registry and on the command line (--until)
    notebook: str    # notebooks/<notebook>.ipynb
    title: str
    record: str      # the chapter's JSON record, relative to the run folder

    @property
    def number(self) -> int:
        return CHAPTERS.index(self) + 1

    @property
    def heading(self) -> str:
        return f"Chapter {self.number}: {self.title}"


# The book's table of contents is generated from this list (book.write_run_pages).
CHAPTERS: tuple[ChapterSpec, ...] = (
    ChapterSpec("corpus", "01_corpus", "Corpus", "corpus/corpus.json"),
    ChapterSpec("audit", "02_audit", "Audit", "audit/audit.json"),
    ChapterSpec("split", "03_split", "Split", "split/split.json"),
    ChapterSpec("probes", "04_probes", "Probes", "probes/probes.json"),
    ChapterSpec("training", "05_training", "Training", "training/training.json"),
    ChapterSpec("ptq", "06_ptq", "Post-training quantisation", "ptq/ptq.json"),
    ChapterSpec("runtime", "07_runtime", "Runtime", "runtime/runtime.json"),
    ChapterSpec("per_class", "08_per_class", "Per-class analysis", "analysis/per_class.json"),
    ChapterSpec("fruit_slice", "09_fruit_slice", "Fruit-label slice", "analysis/fruit_slice.json"),
    ChapterSpec("field", "10_field", "Field transfer and background reliance", "field/field.json"),
    ChapterSpec("abstention", "11_abstention", "Calibration and abstention", "abstention/abstention.json"),
)
