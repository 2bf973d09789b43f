"""Class-name taxonomy: crop, condition, type (healthy / broad / specific), pest and fruit flags.

Folder names are the only label source, so the taxonomy is read from them by naming rules.  The rules
are data (the keyword sets below); a rule change is a reviewed change of this file, and the class map
carries a fingerprint of the result.

Two naming styles:

* ``plantvillage`` — ``Crop___Condition`` (three underscores), e.g. ``Tomato___Spider_mites
  Two-spotted_spider_mite``, ``Corn_(maize)___Northern_Leaf_Blight``, ``Pepper,_bell___healthy``.
* ``crop_condition`` — ``crop_condition`` in snake case, e.g. ``bean_fungal_disease``,
  ``banana_healthy_fruit``.  The crop is the longest prefix listed in :data:`MULTIWORD_CROPS`, else
  the first word; a one-word name (``healthy``) is a condition with no crop.

Crop and condition are *slugs*: lower case, runs of anything but letters and digits turned into one
``_`` (``Corn_(maize)`` → ``corn_maize``).  The flags are read from the condition's words only, never
from the crop (``passion_fruit_healthy`` is not a fruit-target class):

* **type** — ``healthy`` if a condition word is ``healthy``.  Otherwise ``broad`` if every condition
  word, after dropping the crop's own words, plant parts (:data:`PLANT_PARTS`) and fillers
  (:data:`FILLER_WORDS`), is a category word (:data:`BROAD_WORDS`): ``fungal_disease``,
  ``nutrient_deficiency``, ``pest_damage``, ``mites``.  A condition with no words left
  (``banana_fruit``) is broad too: it names no disease.  Anything else is ``specific``.
  Decision on mites: ``mites`` alone names an order of pests and is broad (``grape_mites``);
  ``spider_mites`` names one family and is specific (``tomato_spider_mites``, PlantVillage's
  ``Spider_mites Two-spotted_spider_mite``).
* **pest** — a condition word is in :data:`PEST_WORDS` or ends with one of :data:`PEST_SUFFIXES`
  (armyworm, leafhopper, stinkbug, whiteflies), unless the condition contains a phrase in
  :data:`NOT_PEST_PHRASES` (the fungal ``fly_speck``).  Viruses that insects carry are not pests.
* **fruit** — a condition word is in :data:`FRUIT_WORDS` (fruit, berry, pod, ear, cob, tuber, boll…):
  the photo's target is the harvested organ, not the leaf.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from ..core.evidence import sha256_json

PLANTVILLAGE = "plantvillage"
CROP_CONDITION = "crop_condition"
PLANTVILLAGE_SEPARATOR = "___"
TYPES = ("healthy", "broad", "specific")

# Crops whose name is more than one word in snake-case names (longest match wins).
MULTIWORD_CROPS: tuple[str, ...] = (
    "bell_pepper", "pepper_bell", "sweet_pepper", "chili_pepper", "chilli_pepper", "hot_pepper",
    "black_pepper", "sweet_potato", "sweet_corn", "corn_maize", "sugar_cane", "sugar_beet",
    "passion_fruit", "dragon_fruit", "star_fruit", "bitter_gourd", "bottle_gourd", "ridge_gourd",
    "snake_gourd", "oil_palm", "date_palm", "broad_bean", "faba_bean", "green_bean", "french_bean",
    "kidney_bean", "mung_bean", "soy_bean", "lady_finger", "cherry_including_sour", "bok_choy",
)
HEALTHY_WORDS = frozenset({"healthy"})
BROAD_WORDS = frozenset({
    "disease", "diseases", "diseased", "fungal", "fungus", "fungi", "bacterial", "bacteria", "viral",
    "virus", "viruses", "nutrient", "nutrients", "deficiency", "deficient", "pest", "pests", "insect",
    "insects", "mite", "mites", "damage", "damaged", "infection", "infected", "infestation",
    "unhealthy", "sick", "abiotic", "biotic", "stress", "disorder", "disorders", "other", "mixed",
    "unknown",
})
PLANT_PARTS = frozenset({
    "leaf", "leaves", "fruit", "fruits", "berry", "berries", "pod", "pods", "ear", "ears", "cob", "cobs",
    "tuber", "tubers", "bunch", "bunches", "boll", "bolls", "grain", "grains", "nut", "nuts", "kernel",
    "kernels", "stem", "stems", "stalk", "root", "roots", "plant", "plants", "flower", "flowers",
})
FILLER_WORDS = frozenset({"and", "of", "on", "the", "with", "in", "general", "symptoms", "symptom"})
FRUIT_WORDS = frozenset({
    "fruit", "fruits", "berry", "berries", "pod", "pods", "ear", "ears", "cob", "cobs", "tuber", "tubers",
    "bunch", "bunches", "boll", "bolls", "grain", "grains", "nut", "nuts", "kernel", "kernels",
})
PEST_WORDS = frozenset({
    "pest", "pests", "insect", "insects", "mite", "mites", "spider", "aphid", "aphids", "thrips",
    "whitefly", "whiteflies", "caterpillar", "caterpillars", "beetle", "beetles", "leafminer",
    "leafminers", "miner", "miners", "mealybug", "mealybugs", "scale", "borer", "borers", "weevil",
    "weevils", "larva", "larvae", "locust", "locusts", "grasshopper", "grasshoppers", "moth", "moths",
    "psyllid", "psyllids", "nematode", "nematodes", "slug", "slugs", "snail", "snails", "mealy",
    "armyworm", "armyworms", "bollworm", "bollworms",
})
PEST_SUFFIXES: tuple[str, ...] = ("worm", "worms", "hopper", "hoppers", "bug", "bugs", "fly", "flies")
NOT_PEST_PHRASES: tuple[str, ...] = ("fly_speck", "flyspeck")


class TaxonomyError(ValueError):
    """A class name cannot be read by the naming rules (empty, or a PlantVillage name without a part)."""


@dataclass(frozen=True)
class ClassInfo:
    name: str
    crop: str
    condition: str
    type: str
    pest: bool
    fruit: bool
    naming: str


def slug(text: str) -> str:
    """Lower case, every run of non-alphanumerics → one ``_``, trimmed."""
    return re.sub(r"[^0-9a-z]+", "_", text.lower()).strip("_")


def split_name(name: str) -> tuple[str, str, str]:
    """(crop slug, condition slug, naming style) of a class folder name."""
    if not name or not slug(name):
        raise TaxonomyError(f"class name {name!r} has no letters or digits; rename the folder")
    if PLANTVILLAGE_SEPARATOR in name:
        crop, _, condition = name.partition(PLANTVILLAGE_SEPARATOR)
        if not slug(crop) or not slug(condition):
            raise TaxonomyError(
                f"class name {name!r} uses PlantVillage's 'Crop___Condition' separator but lacks a "
                "crop or a condition"
            )
        return slug(crop), slug(condition), PLANTVILLAGE
    words = slug(name)
    tokens = words.split("_")
    if len(tokens) == 1:
        return "", words, CROP_CONDITION
    for crop in sorted(MULTIWORD_CROPS, key=len, reverse=True):
        if words.startswith(crop + "_"):
            return crop, words[len(crop) + 1:], CROP_CONDITION
    return tokens[0], "_".join(tokens[1:]), CROP_CONDITION


def _is_pest_word(word: str) -> bool:
    return word in PEST_WORDS or any(word.endswith(suffix) for suffix in PEST_SUFFIXES)


def classify(name: str) -> ClassInfo:
    """Read crop, condition, type, pest and fruit flags from a class folder name."""
    crop, condition, naming = split_name(name)
    words = [w for w in condition.split("_") if w]
    crop_words = set(crop.split("_")) if crop else set()
    if HEALTHY_WORDS & set(words):
        kind = "healthy"
    else:
        meaningful = [w for w in words if w not in PLANT_PARTS and w not in FILLER_WORDS
                      and w not in crop_words]
        kind = "broad" if all(w in BROAD_WORDS for w in meaningful) else "specific"
    padded = f"_{condition}_"
    pest = any(_is_pest_word(w) for w in words) and not any(
        f"_{phrase}_" in padded for phrase in NOT_PEST_PHRASES)
    fruit = any(w in FRUIT_WORDS for w in words)
    return ClassInfo(name=name, crop=crop, condition=condition, type=kind, pest=pest, fruit=fruit,
                     naming=naming)


# --------------------------------------------------------------------------- class map
def class_entries(supports: Mapping[str, int]) -> list[dict[str, Any]]:
    """Class-map entries for admitted classes, indexed in sorted-name order."""
    entries = []
    for index, name in enumerate(sorted(supports)):
        info = asdict(classify(name))
        entries.append({"index": index, **info, "support": int(supports[name])})
    return entries


def build_class_map(
    supports: Mapping[str, int], quarantined_classes: Iterable[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """The ``class_map.json`` object: fingerprinted admitted classes plus the quarantined ones."""
    classes = class_entries(supports)
    quarantined = sorted(
        ({"name": q["name"], "reason": q["reason"], "support": int(q["support"])}
         for q in quarantined_classes),
        key=lambda q: q["name"],
    )
    return {"fingerprint": class_map_fingerprint(classes), "classes": classes,
            "quarantined_classes": quarantined}


def class_map_fingerprint(classes: list[dict[str, Any]]) -> str:
    return sha256_json(classes)


def class_map_table(class_map: Mapping[str, Any]) -> pd.DataFrame:
    """The admitted classes as a table (one row per class, schema columns)."""
    columns = ["index", "name", "crop", "condition", "type", "pest", "fruit", "naming", "support"]
    return pd.DataFrame(class_map["classes"], columns=columns)


def taxonomy_summary(class_map: Mapping[str, Any]) -> dict[str, Any]:
    """Counts per type, pest and fruit classes, and crops, over the admitted classes."""
    classes = class_map["classes"]
    return {
        "n_classes": len(classes),
        "types": {kind: sum(c["type"] == kind for c in classes) for kind in TYPES},
        "pest_classes": [c["name"] for c in classes if c["pest"]],
        "fruit_classes": [c["name"] for c in classes if c["fruit"]],
        "crops": sorted({c["crop"] for c in classes if c["crop"]}),
        "namings": sorted({c["naming"] for c in classes}),
    }
