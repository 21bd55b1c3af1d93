"""Build script: the packages and the C extensions (metadata lives in pyproject.toml).

Each extension is optional: without a C compiler or SQLite's header (Debian: libsqlite3-dev) the
package still installs, the nsys reader uses ADBC for integer columns too (slower; see
``traceguard/ingest/_int_scan.c``), and the launch join's search, the metrics' and the report's
loops run in NumPy and Python (``traceguard/_keys.c``, ``traceguard/metrics/_breakdown.c``,
``traceguard/report/_rows.c``).
"""

from setuptools import Extension, find_namespace_packages, setup

setup(
    packages=[
        *find_namespace_packages(include=["traceguard", "traceguard.*", "api", "api.*"], exclude=["*.__pycache__"]),
        "traceguard._profiles",
        "traceguard._schema",
    ],
    # The checklist profiles and the JSON Schemas of the public documents ship inside the package.
    package_dir={"traceguard._profiles": "profiles", "traceguard._schema": "docs"},
    package_data={
        "api.templates": ["*.html"],
        "traceguard._profiles": ["*.toml"],
        "traceguard._schema": ["*.schema.json"],
        "traceguard.store.migrations": ["script.py.mako"],
    },
    ext_modules=[
        Extension(
            "traceguard.ingest._int_scan",
            sources=["traceguard/ingest/_int_scan.c"],
            libraries=["sqlite3"],
            optional=True,
        ),
        # The launch join's key search (traceguard/model.py keeps the NumPy one).
        Extension("traceguard._keys", sources=["traceguard/_keys.c"], optional=True),
        # The step breakdown's one-pass loop (traceguard/metrics/breakdown.py keeps the NumPy one).
        Extension("traceguard.metrics._breakdown", sources=["traceguard/metrics/_breakdown.c"], optional=True),
        # The report's loops over per-step rows (traceguard/report/rows.py keeps the Python ones).
        Extension("traceguard.report._rows", sources=["traceguard/report/_rows.c"], optional=True),
    ],
)
