"""Sphinx configuration of the specdec-kernels documentation.

Build (warnings are errors, as in ``.ci/run``)::

    python -m sphinx -W --keep-going -b html docs /tmp/docs_html
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # document this checkout, not whatever copy is installed

project = "specdec-kernels"
author = "specdec-kernels contributors"
copyright = "2026, specdec-kernels contributors"  # noqa: A001
release = version = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "numpydoc",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# autodoc: signatures as written, members in source order, no import-time side effects beyond
# importing the package (which never needs a GPU).
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"undoc-members": False}

# numpydoc: the docstrings are numpydoc; class pages list their members through autodoc's
# :members: (numpydoc's own member tables would document every method twice).
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_validation_checks = set()

myst_heading_anchors = 3

html_theme = "alabaster"
html_title = "specdec-kernels"
html_static_path = []
