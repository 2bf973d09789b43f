"""The error explorer over a finished run: which images of a class each model state gets wrong.

* :mod:`.logic` — the run's records loaded and verified (:func:`load`), per-class errors, confusion rows,
  the thumbnail gallery (:func:`render`) and the ipywidgets browser (:func:`browser`).
* :mod:`.app` — the same notebook served as a Voilà app on 127.0.0.1 (``make explore``).
"""

from .logic import ExplorerData, NothingToExplore, browser, load, render

__all__ = ["ExplorerData", "NothingToExplore", "browser", "load", "render"]
