"""The training loop: one model, resumable at any step, one process or several (PyTorch DDP).

What makes a resumed run bit-identical to an uninterrupted one (on CPU):

* the checkpoint holds model, optimiser, scheduler, AMP scaler, EMA, the progress counters and every RNG
  state (per rank), and the loop re-seeds nothing on resume;
* the batch order and each sample's augmentation are pure functions of (seed, epoch, position)
  (``data.EpochBatches``), so the resumed epoch skips exactly the consumed batches;
* the DataLoader draws its base seed from its own generator, not the global one.

Only rank 0 writes files.  The same code runs single-process (no ``WORLD_SIZE`` in the environment) and
under ``torchrun`` (gloo on CPU, NCCL on GPU); gradients are averaged by DDP, validation is sharded
and gathered.

What the loop is given (:class:`.job.Job`) and its device / AMP resolution live in :mod:`.job`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import signal
import time
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from ..core import checkpoint as ckpt
from ..core.config import progress_wanted
from ..core.distributed import barrier, broadcast_buffers, gather
from ..core.evidence import atomic_write_parquet
from ..core.squares import EvalImages
from ..nets.models import (
    count_params,
    create_model,
    distillation_loss,
    freeze_leading_groups,
    frozen_trunk,
    weights_source,
)
from ..nets.predict import val_scores
from .augment import AugmentParams
from .data import EpochBatches, TrainImages, _mix, balanced_weights
from .job import Job, resolve_amp, resolve_device
from .val_trunk import TrunkCache

KILL_ENV = "CROPCOP_KILL_AFTER_STEP"  # test hook: SIGKILL this process right after that optimiser step
MODEL_FORMAT = "cropcop-model-v1"


_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}


def parameters_sha256(model: nn.Module) -> str:
    """SHA-256 of a model's parameters (names, dtypes, shapes, bytes), in registration order.

    Buffers are left out on purpose: DDP broadcasts rank 0's buffers before each forward, but the batch
    norm statistics of the last forward are each rank's own; only the parameters must agree bit for bit.
    """
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        tensor = param.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# --------------------------------------------------------------------------- the loop
class Trainer:
    def __init__(self, job: Job) -> None:
        self.job, self.cfg, self.env = job, job.config, job.env
        threads = int(self.cfg.get("threads") or 0)
        if threads > 0:
            torch.set_num_threads(max(1, threads // self.env.world_size))
        self.device = resolve_device(self.cfg, self.env)
        self.amp = resolve_amp(self.cfg, self.device)
        self.amp_dtype = _AMP_DTYPES[self.amp]
        self.memory_format = torch.channels_last if self.cfg["channels_last"] else torch.contiguous_format
        seed = int(self.cfg["seed"])
        torch.manual_seed(seed)  # model init: identical on every rank (DDP also broadcasts rank 0's)
        np.random.seed(seed % 2**32)
        random.seed(seed)

        self.model = self._new_model(self.cfg["arch"], self.cfg.get("weights"),
                                     self.cfg.get("pretrained_tag"), train=True)
        self.frozen_groups = int(self.cfg.get("frozen_groups") or 0)
        self.frozen = freeze_leading_groups(self.model, self.frozen_groups)
        self.teacher = self._load_teacher() if job.teacher_path is not None else None
        self.config_record = job.fingerprinted_config(self.device.type, self.amp)
        from ..core.evidence import sha256_json

        self.config_fingerprint = sha256_json(self.config_record)

        from timm.optim import create_optimizer_v2
        from timm.scheduler import CosineLRScheduler
        from timm.utils import ModelEmaV3

        self.optimizer = create_optimizer_v2(self.model, "adamw", lr=float(self.cfg["lr"]),
                                             weight_decay=float(self.cfg["weight_decay"]),
                                             layer_decay=self.cfg.get("layer_decay"))
        augment = AugmentParams.from_dict(self.cfg["augment"])
        self.train_set = TrainImages(job.train_rows, job.corpus_root, job.spec, augment,
                                     cache=self.cfg["cache_images"], paste=job.paste)
        labels = self.train_set.labels
        self.sampler_weights = balanced_weights(labels) if self.cfg["imbalance"] == "sampler" else None
        self.class_weights = None
        if self.cfg["imbalance"] == "loss":
            counts = np.bincount(labels, minlength=job.num_classes).clip(min=1)
            self.class_weights = torch.as_tensor(len(labels) / (job.num_classes * counts),
                                                 dtype=torch.float32, device=self.device)
        self.steps_per_epoch = self._batches(0).steps
        total = self.steps_per_epoch * int(self.cfg["epochs"])
        warmup = min(total - 1, round(float(self.cfg["warmup_epochs"]) * self.steps_per_epoch))
        self.scheduler = CosineLRScheduler(self.optimizer, t_initial=total, lr_min=float(self.cfg["min_lr"]),
                                           warmup_t=max(0, warmup), t_in_epochs=False,
                                           warmup_lr_init=float(self.cfg["lr"]) * 0.01)
        ema_cfg = self.cfg["ema"]
        self.ema = (ModelEmaV3(self.model, decay=float(ema_cfg["decay"]), use_warmup=bool(ema_cfg["warmup"]))
                    if ema_cfg["enabled"] else None)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp == "fp16")
        self.val_set = EvalImages(job.val_rows, job.corpus_root, job.spec, cache=self.cfg["cache_images"])
        self.val_trunk = TrunkCache()   # the frozen trunk's outputs on val, computed once (.val_trunk)
        self.progress: dict[str, Any] = {"epoch": 0, "batch": 0, "global_step": 0, "finished": False,
                                         "epoch_loss_sum": 0.0, "epoch_images": 0, "best_score": -1.0,
                                         "best_epoch": 0, "train_seconds": 0.0, "images_seen": 0,
                                         "resumes": 0, "epoch_seed": None, "epoch_seconds": 0.0,
                                         "wall_seconds": 0.0}
        self._clock = time.perf_counter()
        self.history: list[dict[str, Any]] = []
        self.last_path, self.best_path = job.out_dir / "last.pt", job.out_dir / "best.pt"
        self.source = weights_source(self.cfg["arch"], self.cfg.get("weights"),
                                     self.cfg.get("pretrained_tag"))
        self.kill_after = int(os.environ.get(KILL_ENV, "0") or 0)

    # ---- construction helpers
    def _new_model(self, arch: str, weights: str | None, tag: str | None, train: bool) -> nn.Module:
        model = create_model(arch, self.job.num_classes, weights=weights, pretrained_tag=tag,
                             drop_path_rate=float(self.cfg.get("drop_path_rate", 0.0)) if train else 0.0,
                             drop_rate=float(self.cfg.get("drop_rate", 0.0)) if train else 0.0,
                             head_init_std=self.cfg.get("head_init_std"))
        return model.to(self.device, memory_format=self.memory_format)

    def _load_teacher(self) -> nn.Module:
        state = ckpt.load(self.job.teacher_path)
        if state.get("class_names") != list(self.job.class_names):
            raise ckpt.ResumeMismatch(f"teacher {self.job.teacher_path} was trained on another class map; "
                                      "retrain the reference first")
        teacher = create_model(state["arch"], int(state["num_classes"]))
        teacher.load_state_dict(state["model"])
        teacher = teacher.to(self.device, memory_format=self.memory_format).eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        return teacher

    def _batches(self, epoch: int, start: int = 0) -> EpochBatches:
        return EpochBatches(len(self.train_set), int(self.cfg["batch_size"]), int(self.cfg["seed"]), epoch,
                            self.env.rank, self.env.world_size, start, self.sampler_weights)

    # ---- checkpoints
    def _state(self) -> dict[str, Any]:
        rng = gather(ckpt.capture_rng(), self.env)  # every rank's streams, in rank order
        # Every rank's parameter digest: the evidence that DDP kept the ranks in lockstep.
        rank_digests = gather(parameters_sha256(self.model), self.env)
        return {
            "format": ckpt.FORMAT, "kind": self.job.kind, "model": self.model.state_dict(),
            "ema": self.ema.module.state_dict() if self.ema else None,
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(), "rng": rng, "rank_parameters_sha256": rank_digests,
            "progress": dict(self.progress),
            "history": list(self.history), "config": self.config_record,
            "config_fingerprint": self.config_fingerprint,
            "data_fingerprints": dict(self.job.data_fingerprints), **self._identity(),
        }

    def _identity(self) -> dict[str, Any]:
        return {"arch": self.cfg["arch"], "num_classes": self.job.num_classes,
                "image_size": self.job.spec.size, "mean": list(self.job.spec.mean),
                "std": list(self.job.spec.std), "class_names": list(self.job.class_names)}

    def _tick(self) -> None:
        # Wall time of the whole fit (data, steps, validation, checkpoints), summed across resumes.
        now = time.perf_counter()
        self.progress["wall_seconds"] = self.progress.get("wall_seconds", 0.0) + now - self._clock
        self._clock = now

    def save_last(self) -> None:
        self._tick()
        state = self._state()  # collective (RNG gather): every rank calls it
        if self.env.is_main:
            ckpt.save(self.last_path, state)
        barrier(self.env)

    def resume(self) -> bool:
        """Load ``last.pt`` when it exists; refuse (ResumeMismatch) when it is not this run's."""
        if not self.last_path.exists():
            return False
        state = ckpt.load(self.last_path)
        ckpt.check_resume(state, self.last_path, self.job.data_fingerprints, self.config_record,
                          self.config_fingerprint)
        if len(state["rng"]) != self.env.world_size:
            raise ckpt.ResumeMismatch(f"{self.last_path} was written by {len(state['rng'])} process(es); "
                                      f"this run has {self.env.world_size}")
        self.model.load_state_dict(state["model"])
        if self.ema is not None:
            self.ema.module.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.progress = dict(state["progress"])
        self.history = list(state["history"])
        if not self.progress["finished"]:
            self.progress["resumes"] += 1
            expected = self._batches(self.progress["epoch"]).order_seed
            if self.progress["epoch_seed"] not in (None, expected):
                raise ckpt.ResumeMismatch(
                    f"{self.last_path}: epoch order seed {self.progress['epoch_seed']} != {expected} "
                    "recomputed; the sampler changed since the checkpoint was written")
        ckpt.restore_rng(state["rng"][self.env.rank])
        return True

    def save_best(self, weights: str, metrics: dict[str, float]) -> None:
        if not self.env.is_main:
            return
        source = self.ema.module if weights == "ema" else self.model
        ckpt.save(self.best_path, {
            "format": MODEL_FORMAT, "kind": self.job.kind, "model": source.state_dict(), "weights": weights,
            "epoch": self.progress["epoch"] + 1, "global_step": self.progress["global_step"],
            "val_macro_f1": metrics["macro_f1"], "val_acc": metrics["accuracy"],
            "config": self.config_record, "config_fingerprint": self.config_fingerprint,
            "data_fingerprints": dict(self.job.data_fingerprints),
            "pretrained": self.source,
            "teacher_sha256": self.job.teacher_sha256, "params": count_params(self.model), **self._identity(),
        })

    # ---- evaluation
    @torch.inference_mode()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Val loss, accuracy and macro-F1; each rank scores a stride of the rows, rank 0's view is all."""
        was_training = model.training
        model.eval()
        broadcast_buffers(model, self.env)  # every shard scored with the statistics rank 0 saves
        shard = Subset(self.val_set, list(range(self.env.rank, len(self.val_set), self.env.world_size)))
        loader = DataLoader(shard, batch_size=int(self.cfg["eval_batch_size"]), shuffle=False,
                            num_workers=int(self.cfg["workers"]), generator=torch.Generator())
        indices, logits = [], []

        def prepare(images: torch.Tensor) -> torch.Tensor:
            return images.to(self.device).contiguous(memory_format=self.memory_format)

        split = frozen_trunk(model, self.frozen_groups)
        with self._autocast():
            if split is None:
                for images, index in loader:
                    logits.append(model(prepare(images)).float().cpu())
                    indices.append(index)
            else:
                trunk, rest = split
                for index, features in self.val_trunk.outputs(trunk, loader, prepare):
                    logits.append(rest(features).float().cpu())
                    indices.append(index)
        part = (torch.cat(indices) if indices else torch.empty(0, dtype=torch.long),
                torch.cat(logits) if logits else torch.empty(0, self.job.num_classes))
        gathered = gather(part, self.env)
        order = torch.cat([g[0] for g in gathered])
        all_logits = torch.cat([g[1] for g in gathered])[order.argsort()]
        model.train(was_training)
        y = torch.as_tensor(self.val_set_labels())
        return {"loss": float(F.cross_entropy(all_logits, y)),
                **val_scores(y.numpy(), all_logits.argmax(1).numpy())}

    def val_set_labels(self) -> np.ndarray:
        return np.array(self.job.val_rows["label"], dtype=np.int64)

    def _autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device.type, dtype=self.amp_dtype or torch.bfloat16,
                              enabled=self.amp_dtype is not None)

    # ---- training
    def _step(self, images: torch.Tensor, labels: torch.Tensor, ddp_model: nn.Module) -> float:
        images = images.to(self.device, non_blocking=True)
        low = self.cfg.get("low_res")
        if low and self.progress["epoch"] < int(low["epochs"]):
            # progressive resizing: the early epochs cost ~(px / size)^2 of a full step, the last ones
            # adapt the network to the size it is scored at
            images = F.interpolate(images, size=(int(low["px"]),) * 2, mode="bilinear", antialias=True)
        images = images.contiguous(memory_format=self.memory_format)
        labels = labels.to(self.device, non_blocking=True)
        smoothing = float(self.cfg["label_smoothing"])
        with self._autocast():
            logits = ddp_model(images)
            if self.teacher is not None:
                with torch.no_grad():
                    teacher_logits = self.teacher(images)
                d = self.cfg["distill"]
                loss = distillation_loss(logits, teacher_logits, labels, float(d["temperature"]),
                                         float(d["alpha"]), smoothing, self.class_weights)
            else:
                loss = F.cross_entropy(logits.float(), labels, weight=self.class_weights,
                                       label_smoothing=smoothing)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.cfg.get("grad_clip"):
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), float(self.cfg["grad_clip"]))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.progress["global_step"] += 1
        self.scheduler.step_update(num_updates=self.progress["global_step"])
        if self.ema is not None:
            self.ema.update(self.model, step=self.progress["global_step"])
        return float(loss.detach())

    def fit(self) -> dict[str, Any]:
        """Train to the configured number of epochs (resuming from ``last.pt``); returns the progress."""
        resumed = self.resume()
        if not resumed:
            torch.manual_seed(_mix(int(self.cfg["seed"]), 3, self.env.rank))  # per-rank dropout streams
        if self.progress["finished"]:
            return self.summary()
        self._clock = time.perf_counter()
        self.train_set.squares.fill()
        self.val_set.squares.fill()
        ddp_model = self.model
        if self.env.enabled:
            from torch.nn.parallel import DistributedDataParallel

            ddp_model = DistributedDataParallel(self.model, device_ids=[self.device.index]
                                                if self.device.type == "cuda" else None)
        self.model.train()
        epochs = int(self.cfg["epochs"])
        # One bar per model over all its steps: a few lines in a notebook, not one per batch and epoch.
        bar = tqdm(total=epochs * self.steps_per_epoch, initial=self.progress["global_step"],
                   desc=f"{self.job.kind} ({self.cfg['arch']})", unit="step", mininterval=30.0,
                   disable=not progress_wanted(self.job.progress and self.env.is_main))
        while self.progress["epoch"] < epochs:
            self._train_epoch(ddp_model, epochs, bar)
        bar.close()
        return self.summary()

    def _train_epoch(self, ddp_model: nn.Module, epochs: int, bar: tqdm) -> None:
        p = self.progress
        epoch, start = p["epoch"], p["batch"]
        batches = self._batches(epoch, start)
        p["epoch_seed"] = batches.order_seed
        workers = int(self.cfg["workers"])
        # The teacher's forward pass runs in the training step, on the step's threads: in a DataLoader
        # worker (one thread beside them) it slowed distillation on 2 cores (bench/loader_bench.py).
        loader = DataLoader(self.train_set, batch_sampler=batches, num_workers=workers,
                            generator=torch.Generator(), pin_memory=self.device.type == "cuda")
        every = int(self.cfg.get("checkpoint_every") or 0)
        last = time.perf_counter()
        for index, (images, labels) in enumerate(loader, start=start):
            loss = self._step(images, labels, ddp_model)
            # Time spent loading and stepping (not checkpointing), carried across resumes in progress.
            now = time.perf_counter()
            p["epoch_seconds"] = p.get("epoch_seconds", 0.0) + now - last
            p["train_seconds"] += now - last
            p["epoch_loss_sum"] += loss * len(labels)
            p["epoch_images"] += len(labels)
            p["images_seen"] += len(labels) * self.env.world_size
            p["batch"] = index + 1
            bar.update()
            bar.set_postfix(epoch=f"{epoch + 1}/{epochs}", loss=f"{loss:.3f}", refresh=False)
            if every and p["global_step"] % every == 0 and p["batch"] < batches.steps:
                self.save_last()
            if self.kill_after and p["global_step"] == self.kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
            last = time.perf_counter()
        self._end_epoch(epoch, epochs, p.get("epoch_seconds", 0.0))

    def _end_epoch(self, epoch: int, epochs: int, seconds: float) -> None:
        p = self.progress
        totals = gather((p["epoch_loss_sum"], p["epoch_images"]), self.env)
        train_loss = sum(t[0] for t in totals) / max(1, sum(t[1] for t in totals))
        # With an EMA, the raw weights are scored at the last epoch only (raw_eval: final): on a CPU each
        # validation pass costs ~5 % of an epoch, and the raw weights trail their average until the end.
        raw_now = self.ema is None or self.cfg["raw_eval"] == "every" or epoch + 1 >= epochs
        raw = self.evaluate(self.model) if raw_now else None
        ema = self.evaluate(self.ema.module) if self.ema is not None else None
        use_ema = ema is not None and (raw is None or ema["macro_f1"] > raw["macro_f1"])
        weights, chosen = ("ema", ema) if use_ema else ("raw", raw)
        unscored = {"loss": float("nan"), "accuracy": float("nan"), "macro_f1": float("nan")}
        raw = raw or unscored
        row = {"model": self.job.kind, "epoch": epoch + 1, "step": p["global_step"],
               "lr": float(self.optimizer.param_groups[0]["lr"]), "train_loss": train_loss,
               "val_loss": raw["loss"], "val_acc": raw["accuracy"], "val_macro_f1": raw["macro_f1"],
               "val_acc_ema": ema["accuracy"] if ema else float("nan"),
               "val_macro_f1_ema": ema["macro_f1"] if ema else float("nan"),
               "selected": weights, "selected_macro_f1": chosen["macro_f1"],
               "selected_acc": chosen["accuracy"], "epoch_seconds": seconds,
               "images_per_s": p["epoch_images"] * self.env.world_size / max(seconds, 1e-9)}
        if chosen["macro_f1"] > p["best_score"]:
            p["best_score"], p["best_epoch"] = chosen["macro_f1"], epoch + 1
            self.save_best(weights, chosen)
        row["best"] = p["best_epoch"] == epoch + 1
        self.history.append(row)
        p.update(epoch=epoch + 1, batch=0, epoch_loss_sum=0.0, epoch_images=0, epoch_seed=None,
                 epoch_seconds=0.0, finished=epoch + 1 >= epochs)
        self.save_last()
        if self.env.is_main:
            atomic_write_parquet(self.job.out_dir / "history.parquet", pd.DataFrame(self.history))

    def summary(self) -> dict[str, Any]:
        p = self.progress
        return {"kind": self.job.kind, "arch": self.cfg["arch"], "params": count_params(self.model),
                "trainable_params": sum(q.numel() for q in self.model.parameters() if q.requires_grad),
                "frozen_modules": len(self.frozen),
                "steps_per_epoch": self.steps_per_epoch, "device": str(self.device), "amp": self.amp,
                "world_size": self.env.world_size, "config": self.config_record,
                "config_fingerprint": self.config_fingerprint, **p,
                "images_per_s": p["images_seen"] / p["train_seconds"] if p["train_seconds"] else float("nan")}
