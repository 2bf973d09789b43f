"""The world the embedded corpus depicts must be one the corpus chapter can read back from folder names."""

from cropcop_utils.corpus import taxonomy
from cropcop_utils.synthetic.lesions import PATTERNS
from cropcop_utils.synthetic.world import CLASS_BY_NAME, CLASSES, CROPS, SOURCES


def test_every_class_has_its_crop_source_and_painter():
    assert len(CLASS_BY_NAME) == len(CLASSES)
    for spec in CLASSES:
        assert spec.crop in CROPS and spec.source in SOURCES and spec.condition in PATTERNS, spec.name
        assert spec.name == f"{spec.crop}_{spec.condition}"


def test_taxonomy_read_from_the_names_is_the_declared_one():
    # The corpus chapter only sees folder names; the generator declares type, pest and fruit.
    for spec in CLASSES:
        read = taxonomy.classify(spec.name)
        assert (read.crop, read.condition) == (spec.crop, spec.condition), spec.name
        assert (read.type, read.pest, read.fruit) == (spec.type, spec.pest, spec.fruit), spec.name


def test_the_world_has_the_traps_the_book_needs():
    kinds = {spec.type for spec in CLASSES}
    assert kinds == {"healthy", "broad", "specific"}
    assert any(s.pest for s in CLASSES) and any(s.fruit for s in CLASSES)
    assert sum(s.singleton for s in CLASSES) == 1
    assert len({s.source for s in CLASSES}) == len(SOURCES) > 1  # sources correlate with classes
