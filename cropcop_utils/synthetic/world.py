"""The world the embedded corpus depicts: acquisition sources, crops and classes, with their planted cues.

Kept apart from the generator (:mod:`cropcop_utils.synthetic`) and the renderer
(:mod:`cropcop_utils.synthetic.drawing`) so that both read one description of what is being drawn.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceSpec:
    """An acquisition setup: its background, frame, JPEG quality and camera, all correlated with class."""

    name: str
    make: str
    model: str
    quality: int
    background: tuple[int, int, int]
    border: str                     # "frame" (coloured band) or "vignette" (dark corners)
    border_colour: tuple[int, int, int]
    border_frac: float              # frame width (or vignette strength) relative to the image side
    shadow: float                   # drop-shadow darkness under the subject
    gradient: float                 # top-to-bottom light fall-off: EXIF orientation changes it
    noise: float                    # sensor noise (std, grey levels) at output size


SOURCES: dict[str, SourceSpec] = {s.name: s for s in (
    SourceSpec("lab_bench", "Canon", "Canon EOS 80D", 92, (214, 212, 204), "frame", (62, 62, 66), 0.035,
               0.28, 16.0, 2.0),
    SourceSpec("field_phone", "samsung", "SM-G991B", 76, (108, 90, 62), "vignette", (0, 0, 0), 0.55,
               0.35, 10.0, 6.0),
    SourceSpec("greenhouse_cam", "Raspberry Pi", "RP_imx477", 84, (118, 134, 152), "frame", (24, 126, 112),
               0.05, 0.22, 14.0, 4.0),
    SourceSpec("flatbed_scan", "EPSON", "Perfection V600", 95, (26, 26, 32), "frame", (236, 234, 226), 0.065,
               0.0, 6.0, 1.5),
)}


@dataclass(frozen=True)
class CropSpec:
    """Shape and colour of a crop's leaf (or fruit) in leaf-local coordinates, as fractions of the canvas."""

    shape: str                      # profile leaves: ovate/elliptic/cordate/strap; palmate; banana
    colour: tuple[int, int, int]
    length: float = 0.8
    width: float = 0.4
    teeth: float = 0.0              # marginal teeth per leaf side
    tooth_amp: float = 0.0
    wobble: float = 0.02            # slow irregularity of the margin
    laterals: int = 6               # lateral vein pairs


CROPS: dict[str, CropSpec] = {
    "tomato": CropSpec("ovate", (62, 128, 48), 0.78, 0.44, teeth=7, tooth_amp=0.10, wobble=0.05, laterals=5),
    "apple": CropSpec("elliptic", (50, 106, 42), 0.80, 0.40, teeth=22, tooth_amp=0.025, laterals=8),
    "grape": CropSpec("palmate", (80, 142, 60)),
    "bean": CropSpec("cordate", (92, 156, 66), 0.74, 0.56, wobble=0.03, laterals=5),
    "corn": CropSpec("strap", (96, 154, 54), 0.98, 0.16, teeth=16, tooth_amp=0.025, wobble=0.015),
    "banana": CropSpec("banana", (234, 200, 62)),
}


@dataclass(frozen=True)
class ClassSpec:
    name: str
    crop: str
    condition: str
    type: str                       # healthy | broad | specific
    source: str                     # preferred acquisition source
    pest: bool = False
    fruit: bool = False
    singleton: bool = False


# In size order, largest first: the geometric long tail is dealt out along this list.  The singleton
# class (one image, to be quarantined by the corpus chapter) comes last and is not part of the tail.
CLASSES: tuple[ClassSpec, ...] = (
    ClassSpec("tomato_late_blight", "tomato", "late_blight", "specific", "field_phone"),
    ClassSpec("tomato_healthy", "tomato", "healthy", "healthy", "lab_bench"),
    ClassSpec("corn_common_rust", "corn", "common_rust", "specific", "field_phone"),
    ClassSpec("apple_scab", "apple", "scab", "specific", "field_phone"),
    ClassSpec("grape_black_rot", "grape", "black_rot", "specific", "greenhouse_cam"),
    ClassSpec("tomato_early_blight", "tomato", "early_blight", "specific", "greenhouse_cam"),
    ClassSpec("bean_fungal_disease", "bean", "fungal_disease", "broad", "greenhouse_cam"),
    ClassSpec("apple_healthy", "apple", "healthy", "healthy", "flatbed_scan"),
    ClassSpec("corn_nutrient_deficiency", "corn", "nutrient_deficiency", "broad", "lab_bench"),
    ClassSpec("grape_healthy", "grape", "healthy", "healthy", "lab_bench"),
    ClassSpec("tomato_mosaic_virus", "tomato", "mosaic_virus", "specific", "lab_bench"),
    ClassSpec("banana_healthy_fruit", "banana", "healthy_fruit", "healthy", "flatbed_scan", fruit=True),
    ClassSpec("bean_healthy", "bean", "healthy", "healthy", "field_phone"),
    ClassSpec("apple_cedar_rust", "apple", "cedar_rust", "specific", "flatbed_scan"),
    ClassSpec("banana_disease_fruit", "banana", "disease_fruit", "broad", "lab_bench", fruit=True),
    ClassSpec("tomato_spider_mites", "tomato", "spider_mites", "specific", "greenhouse_cam", pest=True),
    ClassSpec("grape_mites", "grape", "mites", "broad", "greenhouse_cam", pest=True),
    ClassSpec("apple_powdery_mildew", "apple", "powdery_mildew", "specific", "flatbed_scan", singleton=True),
)
CLASS_BY_NAME = {c.name: c for c in CLASSES}
