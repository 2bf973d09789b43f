import pytest
import yaml

from cropcop_utils.core import config
from cropcop_utils.core.config import RunFolderConflict


@pytest.mark.parametrize("name", ["smoke", "default", "paper"])
def test_profiles_load_with_the_shared_sections(name):
    params = config.load_profile(name)
    assert params["name"] == name
    for section in ("synthetic", "image", "corpus", "audit", "split"):
        assert isinstance(params[section], dict), section
    fractions = params["split"]["fractions"]
    assert sum(fractions.values()) == pytest.approx(1.0)


def test_paper_profile_carries_the_study_resolution():
    assert config.load_profile("paper")["image"]["size"] == 256


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(FileNotFoundError, match="smoke"):
        config.load_profile("nope")


def test_overrides_merge_deeply():
    params = config.load_profile("smoke", {"image": {"size": 32}})
    assert params["image"]["size"] == 32
    assert params["image"]["mean"] == config.load_profile("smoke")["image"]["mean"]


def test_open_run_writes_params_and_refuses_other_settings(tmp_path):
    ctx = config.open_run(tmp_path / "run", profile="smoke")
    recorded = yaml.safe_load((tmp_path / "run" / "params.yaml").read_text())
    assert recorded["fingerprint"] == ctx.fingerprint
    assert ctx.corpus_root == (tmp_path / "run").resolve() / "synthetic" / "corpus"
    assert config.open_run(tmp_path / "run", profile="smoke").fingerprint == ctx.fingerprint
    with pytest.raises(RunFolderConflict, match="profile 'smoke'"):
        config.open_run(tmp_path / "run", profile="default")
    assert config.reopen_run(tmp_path / "run").params == ctx.params


def test_open_run_on_a_real_folder(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    ctx = config.open_run(tmp_path / "run", profile="smoke", data=str(corpus))
    assert not ctx.is_synthetic and ctx.corpus_root == corpus.resolve()
    with pytest.raises(FileNotFoundError, match="no such corpus folder"):
        config.open_run(tmp_path / "run2", profile="smoke", data=str(tmp_path / "missing"))


def test_reopen_detects_edited_params(tmp_path):
    config.open_run(tmp_path, profile="smoke")
    path = tmp_path / "params.yaml"
    path.write_text(path.read_text().replace("name: smoke", "name: edited"))
    with pytest.raises(RunFolderConflict, match="edited"):
        config.reopen_run(tmp_path)


@pytest.mark.parametrize(("env", "requested", "expected"), [
    (None, True, True), (None, False, False), ("1", True, False), ("true", True, False), ("0", True, True),
    ("", True, True),
])
def test_progress_bars_follow_the_caller_and_tqdm_disable(monkeypatch, env, requested, expected):
    if env is None:
        monkeypatch.delenv("TQDM_DISABLE", raising=False)
    else:
        monkeypatch.setenv("TQDM_DISABLE", env)
    assert config.progress_wanted(requested) is expected


def test_field_defaults_to_synthetic_with_the_synthetic_corpus_and_is_recorded(tmp_path):
    ctx = config.open_run(tmp_path / "run", profile="smoke")
    assert ctx.params["field"] == "synthetic"
    assert ctx.field_root == (tmp_path / "run").resolve() / "synthetic" / "field"
    # A chapter notebook passes no field: the recorded one is used and the fingerprint holds.
    assert config.open_run(tmp_path / "run", profile="smoke").field_root == ctx.field_root
    assert config.reopen_run(tmp_path / "run").field_root == ctx.field_root


def test_field_folder_is_recorded_absolute_and_reused_by_later_chapters(tmp_path, monkeypatch):
    corpus, field = tmp_path / "lab", tmp_path / "orchard"
    corpus.mkdir()
    field.mkdir()
    monkeypatch.chdir(tmp_path)
    ctx = config.open_run(tmp_path / "run", profile="smoke", data=str(corpus), field="orchard")
    assert ctx.params["field"] == str(field.resolve()) and ctx.field_root == field.resolve()
    again = config.open_run(tmp_path / "run", profile="smoke", data=str(corpus))
    assert again.fingerprint == ctx.fingerprint and again.field_root == field.resolve()
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(RunFolderConflict, match="field cohort"):
        config.open_run(tmp_path / "run", profile="smoke", data=str(corpus), field=str(other))


def test_real_corpus_without_field_has_none_and_bad_fields_are_refused(tmp_path):
    corpus = tmp_path / "lab"
    corpus.mkdir()
    ctx = config.open_run(tmp_path / "run", profile="smoke", data=str(corpus))
    assert ctx.params["field"] is None and ctx.field_root is None
    with pytest.raises(FileNotFoundError, match="no such field-cohort folder"):
        config.open_run(tmp_path / "run2", profile="smoke", data=str(corpus), field=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="needs --data synthetic"):
        config.open_run(tmp_path / "run3", profile="smoke", data=str(corpus), field="synthetic")
    assert not (tmp_path / "run2").exists() and not (tmp_path / "run3").exists()


def test_run_folders_from_before_the_field_option_still_reopen(tmp_path):
    params = config.load_profile("smoke")
    params["data"] = "synthetic"
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump({"fingerprint": config.sha256_json(params), "params": params}, sort_keys=False))
    ctx = config.open_run(tmp_path, profile="smoke")
    assert "field" not in ctx.params and ctx.field_root is None


def test_parameter_sections_refuse_unknown_keys_by_name_and_read_lists_as_tuples():
    from cropcop_utils.training.augment import AugmentConfigError, AugmentParams
    from cropcop_utils.training.regimes.backgrounds import BackgroundConfigError, RobustParams

    with pytest.raises(AugmentConfigError, match=r"training\.augment: unknown key\(s\) \['hflipp'\]"):
        AugmentParams.from_dict({"hflipp": 0.5})
    refused = r"training\.background_robust: unknown key\(s\) \['lite'\]"
    with pytest.raises(BackgroundConfigError, match=refused):
        RobustParams.from_dict({"lite": [0.7, 1.2]})
    params = RobustParams.from_dict({"light": [0.7, 1.2]})
    assert params.light == (0.7, 1.2) and params.gamma == RobustParams().gamma


def test_field_train_is_recorded_absolute_reused_and_a_different_one_refused(tmp_path, monkeypatch):
    from cropcop_utils.core.sources import FIELD_TRAIN, LAB

    corpus, photos = tmp_path / "lab", tmp_path / "orchard_train"
    corpus.mkdir()
    photos.mkdir()
    monkeypatch.chdir(tmp_path)
    ctx = config.open_run(tmp_path / "run", profile="smoke", data=str(corpus), field_train="orchard_train")
    assert ctx.params["field_train"] == str(photos.resolve()) and ctx.field_train_root == photos.resolve()
    assert ctx.source_roots == {LAB: corpus.resolve(), FIELD_TRAIN: photos.resolve()}
    recorded = yaml.safe_load((tmp_path / "run" / config.PARAMS_NAME).read_text())["params"]
    assert recorded["field_train"] == str(photos.resolve())
    again = config.open_run(tmp_path / "run", profile="smoke", data=str(corpus))  # a notebook reopening it
    assert again.fingerprint == ctx.fingerprint and again.field_train == ctx.field_train
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(RunFolderConflict, match="field-train"):
        config.open_run(tmp_path / "run", profile="smoke", data=str(corpus), field_train=str(other))
    with pytest.raises(FileNotFoundError, match="--field-train .*nope: no such folder"):
        config.open_run(tmp_path / "run2", profile="smoke", data=str(corpus), field_train=tmp_path / "nope")
    assert not (tmp_path / "run2").exists()
    plain = config.open_run(tmp_path / "run3", profile="smoke", data=str(corpus))
    assert plain.field_train is None and plain.field_train_root is None
    assert plain.source_roots == {LAB: corpus.resolve()}
    with pytest.raises(RunFolderConflict, match="field-train"):  # a run made without it refuses one later
        config.open_run(tmp_path / "run3", profile="smoke", data=str(corpus), field_train=str(photos))


def test_review_verdicts_are_recorded_absolute_kept_on_reopen_and_replaceable_by_the_runner(tmp_path,
                                                                                             monkeypatch):
    first, second = tmp_path / "review.csv", tmp_path / "review2.csv"
    first.write_text("rel_path_a,rel_path_b,verdict\n")
    second.write_text("rel_path_a,rel_path_b,verdict\n")
    monkeypatch.chdir(tmp_path)
    ctx = config.open_run(tmp_path / "run", profile="smoke", review_verdicts="review.csv")
    assert ctx.params["audit"]["review_verdicts"] == str(first.resolve())
    assert ctx.params["audit"]["phash_radius"] == config.load_profile("smoke")["audit"]["phash_radius"]
    again = config.open_run(tmp_path / "run", profile="smoke")  # a notebook reopening it names none
    assert again.fingerprint == ctx.fingerprint
    with pytest.raises(RunFolderConflict):                      # a kernel may not change it ...
        config.open_run(tmp_path / "run", profile="smoke", review_verdicts=second)
    runner = config.open_run(tmp_path / "run", profile="smoke", review_verdicts=second,
                             accept_changed_parameters=True)    # ... the runner may: the audit reruns
    assert runner.params["audit"]["review_verdicts"] == str(second)
    assert config.open_run(tmp_path / "run", profile="smoke").fingerprint == runner.fingerprint
    assert "review_verdicts" not in config.open_run(tmp_path / "run3", profile="smoke").params["audit"]
    with pytest.raises(FileNotFoundError, match="--review-verdicts .*nope.csv: no such file"):
        config.open_run(tmp_path / "run2", profile="smoke", review_verdicts=tmp_path / "nope.csv")
