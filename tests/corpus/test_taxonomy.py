"""Naming rules: both naming styles, types, pest and fruit flags, the class map."""

from __future__ import annotations

import pytest

from cropcop_utils.core.evidence import sha256_json
from cropcop_utils.corpus import taxonomy


@pytest.mark.parametrize(("name", "crop", "condition", "kind", "pest", "fruit"), [
    ("Tomato___healthy", "tomato", "healthy", "healthy", False, False),
    ("Tomato___Spider_mites Two-spotted_spider_mite", "tomato", "spider_mites_two_spotted_spider_mite",
     "specific", True, False),
    ("Corn_(maize)___Northern_Leaf_Blight", "corn_maize", "northern_leaf_blight", "specific", False, False),
    ("Pepper,_bell___Bacterial_spot", "pepper_bell", "bacterial_spot", "specific", False, False),
    ("Tomato___Tomato_Yellow_Leaf_Curl_Virus", "tomato", "tomato_yellow_leaf_curl_virus", "specific",
     False, False),
    ("Apple___Cedar_apple_rust", "apple", "cedar_apple_rust", "specific", False, False),
])
def test_plantvillage_names(name, crop, condition, kind, pest, fruit):
    info = taxonomy.classify(name)
    assert info.naming == "plantvillage"
    got = (info.crop, info.condition, info.type, info.pest, info.fruit)
    assert got == (crop, condition, kind, pest, fruit)


@pytest.mark.parametrize(("name", "crop", "condition", "kind", "pest", "fruit"), [
    ("bean_fungal_disease", "bean", "fungal_disease", "broad", False, False),
    ("rice_bacterial_disease", "rice", "bacterial_disease", "broad", False, False),
    ("cassava_viral_disease", "cassava", "viral_disease", "broad", False, False),
    ("maize_nutrient_deficiency", "maize", "nutrient_deficiency", "broad", False, False),
    ("cotton_pest_damage", "cotton", "pest_damage", "broad", True, False),
    ("grape_mites", "grape", "mites", "broad", True, False),
    ("tomato_spider_mites", "tomato", "spider_mites", "specific", True, False),
    ("banana_healthy_fruit", "banana", "healthy_fruit", "healthy", False, True),
    ("bean_healthy", "bean", "healthy", "healthy", False, False),
    ("coffee_leaf_rust", "coffee", "leaf_rust", "specific", False, False),
    ("maize_fall_armyworm", "maize", "fall_armyworm", "specific", True, False),
    ("citrus_aphids", "citrus", "aphids", "specific", True, False),
    ("cacao_black_pod_rot", "cacao", "black_pod_rot", "specific", False, True),
    ("corn_ear_rot", "corn", "ear_rot", "specific", False, True),
    ("potato_tuber_disease", "potato", "tuber_disease", "broad", False, True),
    ("sweet_potato_weevil", "sweet_potato", "weevil", "specific", True, False),
    ("passion_fruit_healthy", "passion_fruit", "healthy", "healthy", False, False),
    ("apple_fly_speck", "apple", "fly_speck", "specific", False, False),
    ("cucumber_unhealthy", "cucumber", "unhealthy", "broad", False, False),
    ("healthy", "", "healthy", "healthy", False, False),
])
def test_crop_condition_names(name, crop, condition, kind, pest, fruit):
    info = taxonomy.classify(name)
    assert info.naming == "crop_condition"
    got = (info.crop, info.condition, info.type, info.pest, info.fruit)
    assert got == (crop, condition, kind, pest, fruit)


def test_unhealthy_is_not_healthy():
    assert taxonomy.classify("leaf_unhealthy").type != "healthy"


@pytest.mark.parametrize("name", ["", "___", "Tomato___", "___healthy", "()"])
def test_unreadable_names_raise(name):
    with pytest.raises(taxonomy.TaxonomyError):
        taxonomy.classify(name)


def test_class_map_is_sorted_indexed_and_fingerprinted():
    supports = {"tomato_spider_mites": 3, "Tomato___healthy": 10, "bean_fungal_disease": 7}
    quarantined = [{"name": "z_single", "reason": "class_below_min_support", "support": 1}]
    class_map = taxonomy.build_class_map(supports, quarantined)
    names = [c["name"] for c in class_map["classes"]]
    assert names == sorted(supports)
    assert [c["index"] for c in class_map["classes"]] == [0, 1, 2]
    assert [c["support"] for c in class_map["classes"]] == [supports[n] for n in names]
    assert class_map["fingerprint"] == sha256_json(class_map["classes"])
    assert class_map["quarantined_classes"] == quarantined
    assert set(class_map["classes"][0]) == {"index", "name", "crop", "condition", "type", "pest", "fruit",
                                            "naming", "support"}
    changed = taxonomy.build_class_map({**supports, "Tomato___healthy": 11})
    assert changed["fingerprint"] != class_map["fingerprint"]

    summary = taxonomy.taxonomy_summary(class_map)
    assert summary["types"] == {"healthy": 1, "broad": 1, "specific": 1}
    assert summary["pest_classes"] == ["tomato_spider_mites"]
    assert summary["crops"] == ["bean", "tomato"]
    table = taxonomy.class_map_table(class_map)
    assert list(table["name"]) == names and table["pest"].sum() == 1
