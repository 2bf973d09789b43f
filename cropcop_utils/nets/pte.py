"""An ExecuTorch ``.pte`` executed from disk, only after its SHA-256 matches the registry.

Chapter 7 writes the program; every later chapter that scores it loads it here, so the hash check and
the keep-alive rule below live in one place.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..core.evidence import FingerprintMismatch, read_registry, sha256_bytes

PTE = "runtime/model.pte"


class PteIntegrityError(FingerprintMismatch):
    """The .pte on disk is not the program the registry recorded: it is never executed."""


class PteForward:
    """An ExecuTorch program's ``forward`` as a callable batch → logits (what ``predict`` expects).

    It keeps the program (and the bytes it was loaded from) alive: a method whose program has been
    garbage-collected points into freed memory and crashes the interpreter.
    """

    def __init__(self, data: bytes, sha256: str) -> None:
        from executorch.runtime import Runtime

        self.data = data
        self.sha256 = sha256
        self.program = Runtime.get().load_program(data)
        self.method = self.program.load_method("forward")
        if self.method is None:
            raise PteIntegrityError(f"the program {sha256[:16]}… has no 'forward' method")

    @property
    def max_batch(self) -> int:
        """The largest batch the program accepts: the upper bound its input was planned for."""
        return int(self.program.metadata("forward").input_tensor_meta(0).sizes()[0])

    @property
    def n_outputs(self) -> int:
        """1 for a program that returns logits; 2 for one that also returns its pooled features."""
        return int(self.program.metadata("forward").num_outputs())

    def outputs(self, batch: torch.Tensor) -> list[torch.Tensor]:
        """Every output of ``forward`` on ``batch``: logits, then the features where the program has them."""
        return list(self.method.execute([batch.contiguous()]))

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        return self.outputs(batch)[0]


class FeatureRecorder:
    """A program's ``forward`` as a batch → logits callable (what ``predict`` expects) that keeps each
    batch's features (the program's second output), so one pass gives the prediction record and the
    features in the same row order."""

    def __init__(self, forward: PteForward) -> None:
        if forward.n_outputs < 2:
            raise PteIntegrityError(f"the program {forward.sha256[:16]}… returns logits only, no features: "
                                    "it was lowered before chapter 7 added them; rerun chapter 'runtime'")
        self.forward = forward
        self.batches: list[torch.Tensor] = []

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        logits, features = self.forward.outputs(batch)[:2]
        self.batches.append(features.detach().clone())  # the method reuses its output memory
        return logits.clone()

    def matrix(self) -> torch.Tensor:
        """The features of every row scored so far, in order (float32, rows × dim)."""
        return torch.cat(self.batches) if self.batches else torch.empty(0, 0)


def verified_pte_bytes(path: str | os.PathLike, expected_sha256: str, what: str = "") -> bytes:
    """The file's bytes, only if their SHA-256 is ``expected_sha256``; else :class:`PteIntegrityError`."""
    path = Path(path)
    if not path.is_file():
        raise PteIntegrityError(f"{what or path} does not exist; rerun chapter 'runtime' (07_runtime)")
    data = path.read_bytes()
    found = sha256_bytes(data)
    if found != expected_sha256:
        raise PteIntegrityError(
            f"{what or path} was modified after it was written: recorded SHA-256 {expected_sha256[:16]}…, "
            f"found {found[:16]}…. Refusing to execute an unverified program; rerun chapter 'runtime' "
            "(07_runtime) to lower the selected graph again.")
    return data


def load_verified_pte(run_dir: str | os.PathLike, rel_path: str = PTE) -> PteForward:
    """Read the .pte from disk, check its SHA-256 against ``registry.json``, then load it from those bytes.

    Loading the very bytes that were hashed (not the path a second time) leaves no window in which the
    file could change between the check and the load.
    """
    entry = read_registry(run_dir).get(rel_path)
    if entry is None:
        raise PteIntegrityError(f"{rel_path} is not in {Path(run_dir) / 'registry.json'}: no chapter wrote "
                                "it in this run folder; run chapter 'runtime' (07_runtime)")
    data = verified_pte_bytes(Path(run_dir) / rel_path, entry["sha256"], rel_path)
    return PteForward(data, entry["sha256"])
