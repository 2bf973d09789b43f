"""Profiles (one YAML each) and the run context every chapter opens first."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from . import cohorts
from .evidence import atomic_write_text, sha256_json
from .freshness import ReadParams
from .sources import FIELD_TRAIN, LAB

PACKAGE_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = PACKAGE_DIR.parent   # the checkout: notebooks/, the book's _config.yml
PROFILES_DIR = PACKAGE_DIR / "profiles"
PARAMS_NAME = "params.yaml"
SYNTHETIC = "synthetic"


class RunFolderConflict(RuntimeError):
    """The run folder was made with another profile, corpus or overrides."""


def progress_wanted(requested: bool = True) -> bool:
    """Whether to draw a progress bar: the caller asks for one and ``TQDM_DISABLE`` does not forbid it.

    tqdm lets an explicit ``disable=`` argument win over its environment defaults, so the book runner's
    ``TQDM_DISABLE=1`` (bars in executed notebooks would only clutter the book) is honoured here instead.
    """
    return bool(requested) and os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("1", "true", "yes")


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(profile: str | os.PathLike, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load a profile by name (``smoke``, ``default``, ``paper``) or path and apply nested overrides.

    A profile may say ``extends: <profile>`` and list only what differs: it is merged over its base
    (mappings key by key, lists and scalars replaced), so a value lives once.  The result is the
    resolved profile, the one ``params.yaml`` records; ``extends`` stays in it as provenance.
    """
    return deep_merge(_resolve_profile(profile, seen=()), overrides or {})


def _resolve_profile(profile: str | os.PathLike, seen: tuple[Path, ...]) -> dict[str, Any]:
    path = Path(profile)
    if not path.suffix:
        path = PROFILES_DIR / f"{profile}.yaml"
    if not path.exists():
        raise FileNotFoundError(
            f"profile {profile!r} not found; known profiles: {', '.join(available_profiles())}"
        )
    path = path.resolve()
    if path in seen:
        chain = " -> ".join(p.stem for p in (*seen, path))
        raise ValueError(f"profile {path.name}: 'extends' loops ({chain})")
    params = yaml.safe_load(path.read_text()) or {}
    if not isinstance(params, dict):
        raise ValueError(f"profile {path}: expected a mapping at the top level, got {type(params).__name__}")
    base = params.get("extends")
    if base is None:
        return params
    # A base named by a relative path is looked up beside the profile that names it.
    base_ref = Path(str(base))
    if base_ref.suffix and not base_ref.is_absolute():
        base_ref = path.parent / base_ref
    return deep_merge(_resolve_profile(base_ref if base_ref.suffix else str(base), (*seen, path)), params)


def dataclass_from_section(cls: type, section: dict[str, Any] | None, where: str,
                           error: type[Exception]) -> Any:
    """A parameters dataclass built from a profile section: unknown keys refused by name, YAML lists as
    the tuples the dataclass declares; what the fields leave out keeps its default."""
    section = dict(section or {})
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(section) - known)
    if unknown:
        raise error(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in section.items()})


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@dataclass(frozen=True)
class RunContext:
    """What a chapter needs to know about its run: the folder, the resolved parameters, the corpus."""

    run_dir: Path
    params: dict[str, Any]
    fingerprint: str

    @property
    def profile(self) -> str:
        return self.params["name"]

    @property
    def data(self) -> str:
        return self.params["data"]

    @property
    def is_synthetic(self) -> bool:
        return self.data == SYNTHETIC

    @property
    def corpus_root(self) -> Path:
        """The image-folder corpus: the embedded synthetic one lives inside the run folder."""
        if self.is_synthetic:
            return self.run_dir / "synthetic" / "corpus"
        return Path(self.data)

    @property
    def fields(self) -> list[str]:
        """Every field cohort the run was opened with (``--field`` once or more), in order."""
        return cohorts.as_list(self.params.get("field"))

    @property
    def field(self) -> str | None:
        """The primary field cohort (the first ``--field``): an absolute folder, ``"synthetic"`` or None."""
        folders = self.fields
        return folders[0] if folders else None

    @property
    def field_cohorts(self) -> list[cohorts.FieldCohort]:
        """Every scored cohort with its short name and declared source (:mod:`cropcop_utils.core.cohorts`)."""
        return cohorts.field_cohorts(self.params.get("field"), self.params.get("field_sources"))

    def cohort_root(self, cohort: cohorts.FieldCohort) -> Path:
        return self.run_dir / "synthetic" / "field" if cohort.folder == SYNTHETIC else Path(cohort.folder)

    @property
    def field_train_source(self) -> str | None:
        """The declared source of the field-train photos (``--field-train SOURCE=PATH``), or None."""
        return (self.params.get("field_sources") or {}).get(self.field_train or "")

    @property
    def field_root(self) -> Path | None:
        """The field cohort folder: the synthetic one lives inside the run folder; None without one."""
        if self.field is None:
            return None
        if self.field == SYNTHETIC:
            return self.run_dir / "synthetic" / "field"
        return Path(self.field)

    @property
    def field_train(self) -> str | None:
        """The labelled field photos the run may train and select on (``--field-train``): an absolute
        folder, or None."""
        return self.params.get("field_train")

    @property
    def field_train_root(self) -> Path | None:
        return None if self.field_train is None else Path(self.field_train)

    @property
    def source_roots(self) -> dict[str, Path]:
        """``{source: folder}`` for :func:`cropcop_utils.core.squares.row_paths`: the lab corpus, and the
        field-train folder when the run has one."""
        roots = {LAB: self.corpus_root}
        if self.field_train_root is not None:
            roots[FIELD_TRAIN] = self.field_train_root
        return roots

    @property
    def planted_truth_path(self) -> Path | None:
        return self.run_dir / "synthetic" / "planted.json" if self.is_synthetic else None

    def section(self, name: str) -> dict[str, Any]:
        return self.params.get(name, {})


def open_run(
    run_dir: str | os.PathLike,
    profile: str = "default",
    data: str = SYNTHETIC,
    overrides: dict[str, Any] | None = None,
    field: str | os.PathLike | list | tuple | None = None,
    field_train: str | os.PathLike | None = None,
    accept_changed_parameters: bool = False,
    review_verdicts: str | os.PathLike | None = None,
) -> RunContext:
    """Create or reopen a run folder.

    The first call resolves the profile (plus overrides, the corpus and the field cohort) into
    ``params.yaml`` with its fingerprint.  Later calls (each chapter) reopen it and refuse if asked for a
    different profile, corpus, field cohort or overrides, so one run folder always holds one coherent
    chain.

    ``field`` (``--field``): a folder of ``<lab class>/<images>``, ``"synthetic"`` (the generator's field
    cohort; only with the synthetic corpus), a list of them (several cohorts, the first one primary:
    :mod:`cropcop_utils.core.cohorts`) or None; each may be ``SOURCE=PATH``, as may ``field_train``.
    Not given, it is what ``params.yaml`` recorded, so
    a notebook needs no field parameter; a new run folder then gets ``"synthetic"`` with the synthetic
    corpus and no field cohort with a real one.

    ``field_train`` (``--field-train``): a folder of labelled field photos in ``<lab class>/<images>``
    that chapter 1 scans as a training source (recorded as an absolute path); not given, what
    ``params.yaml`` recorded, else None.  A run folder reopened with another one is refused.

    ``review_verdicts`` (``--review-verdicts``): a reviewer's verdict file for chapter 2's review list,
    recorded as ``audit.review_verdicts`` (an absolute path); not given, what ``params.yaml`` recorded,
    else the profile's value.  Unlike a folder above, another file may be given to the same run folder:
    the audit and the chapters after it run again.

    ``accept_changed_parameters`` (the book runner only): a profile whose parameters differ from the
    recorded ones replaces them in ``params.yaml`` (the runner then reruns every chapter that read a
    changed key, :mod:`cropcop_utils.core.freshness`); another corpus, field cohort or field-train folder
    is still refused.
    """
    run_dir = Path(run_dir).resolve()
    if data != SYNTHETIC:
        data = str(Path(data).expanduser().resolve())
        if not Path(data).is_dir():
            raise FileNotFoundError(f"--data {data}: no such corpus folder")
    params_path = run_dir / PARAMS_NAME
    recorded = yaml.safe_load(params_path.read_text()) if params_path.exists() else None
    params = load_profile(profile, overrides)
    params["data"] = data
    # sources declared now join those recorded (a chapter reopening the run names none)
    declared: dict[str, str] = dict((recorded or {}).get("params", {}).get("field_sources") or {})
    if field is not None:
        params["field"] = resolve_fields(field, data, declared)
    elif recorded is not None:
        if "field" in recorded.get("params", {}):  # folders made before --field existed lack the key
            params["field"] = recorded["params"]["field"]
    else:
        params["field"] = SYNTHETIC if data == SYNTHETIC else None
    if field_train is not None:
        source, field_train = cohorts.split_source(field_train)
        params["field_train"] = resolve_field_train(field_train)
        if source is not None:
            declared[params["field_train"]] = source
    elif recorded is not None:
        if "field_train" in recorded.get("params", {}):  # folders made before --field-train lack the key
            params["field_train"] = recorded["params"]["field_train"]
    else:
        params["field_train"] = None
    # kept like field-train, so a chapter reopening the run (naming none) computes the same parameters
    verdicts = (resolve_review_verdicts(review_verdicts) if review_verdicts is not None
                else ((recorded or {}).get("params", {}).get("audit") or {}).get("review_verdicts"))
    if verdicts is not None:
        params["audit"] = {**(params.get("audit") or {}), "review_verdicts": verdicts}
    if declared:  # only when declared, so run folders made before sources existed keep their fingerprint
        params["field_sources"] = declared
    fingerprint = sha256_json(params)
    changed = changed_parameters(recorded["params"], params) if recorded is not None else []
    if recorded is not None and recorded.get("fingerprint") != fingerprint and (
            not accept_changed_parameters or set(changed) & set(RUN_IDENTITY)):
        raise RunFolderConflict(
            f"{run_dir} was made with profile {recorded['params'].get('name')!r} on "
            f"{recorded['params'].get('data')!r}, field cohort {recorded['params'].get('field')!r}, "
            f"field-train {recorded['params'].get('field_train')!r} "
            f"(params fingerprint {str(recorded.get('fingerprint'))[:12]}…); this call asks for "
            f"profile {profile!r} on {data!r}, field cohort {params.get('field')!r}, field-train "
            f"{params.get('field_train')!r} ({fingerprint[:12]}…). Use a new --run-dir or the same "
            "settings."
            + (f" (Only profile parameters may change in a run folder; {', '.join(changed)} differ.)"
               if accept_changed_parameters else "")
        )
    if recorded is None or recorded.get("fingerprint") != fingerprint:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(params_path, yaml.safe_dump({"fingerprint": fingerprint, "params": params},
                                                      sort_keys=False))
    return RunContext(run_dir=run_dir, params=ReadParams(params, run_dir), fingerprint=fingerprint)


# What a run folder is about; a profile's other parameters may change between invocations of the runner.
RUN_IDENTITY = ("data", "field", "field_train", "field_sources")


def changed_parameters(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The top-level keys whose values differ between two resolved parameter sets."""
    return sorted(k for k in set(before) | set(after)
                  if sha256_json(before.get(k)) != sha256_json(after.get(k)))


def resolve_fields(field: str | os.PathLike | list | tuple, data: str,
                   declared: dict[str, str]) -> str | list[str]:
    """``--field`` given once or several times, as recorded: one string, or a list for several (each
    resolved by :func:`resolve_field`); a declared ``SOURCE=`` goes into ``declared``."""
    folders = []
    for value in cohorts.as_list(field):
        source, path = cohorts.split_source(value)
        folder = resolve_field(path, data)
        if folder in folders:
            raise ValueError(f"--field {folder} is given twice: each scored cohort once")
        folders.append(folder)
        if source is not None:
            declared[folder] = source
    if not folders:
        raise ValueError("--field: an empty list of field cohorts; leave --field out for none")
    return folders[0] if len(folders) == 1 else folders


def resolve_field(field: str | os.PathLike, data: str) -> str:
    """``--field`` as recorded: ``"synthetic"`` or the absolute path of an existing folder."""
    if str(field) == SYNTHETIC:
        if data != SYNTHETIC:
            raise ValueError(
                "--field synthetic draws the synthetic classes and needs --data synthetic; give a folder "
                "of <lab class>/<images> for a real corpus")
        return SYNTHETIC
    path = Path(field).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"--field {path}: no such field-cohort folder")
    return str(path)


def resolve_field_train(field_train: str | os.PathLike) -> str:
    """``--field-train`` as recorded: the absolute path of an existing folder."""
    path = Path(field_train).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"--field-train {path}: no such folder of labelled field photos "
                                "(<lab class>/<images>)")
    return str(path)


def resolve_review_verdicts(path: str | os.PathLike) -> str:
    """``--review-verdicts`` as recorded: the absolute path of an existing file."""
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise FileNotFoundError(f"--review-verdicts {resolved}: no such file (fill in audit/review.csv of a "
                                "run folder and give its path)")
    return str(resolved)


def reopen_run(run_dir: str | os.PathLike) -> RunContext:
    """Open an existing run folder with whatever it was made with (the explorer uses this)."""
    run_dir = Path(run_dir).resolve()
    params_path = run_dir / PARAMS_NAME
    if not params_path.exists():
        raise FileNotFoundError(f"{run_dir} has no {PARAMS_NAME}: not a CropCop run folder")
    recorded = yaml.safe_load(params_path.read_text())
    if sha256_json(recorded["params"]) != recorded["fingerprint"]:
        raise RunFolderConflict(f"{params_path} was edited after it was written (fingerprint mismatch)")
    return RunContext(run_dir=run_dir, params=ReadParams(recorded["params"], run_dir),
                      fingerprint=recorded["fingerprint"])
