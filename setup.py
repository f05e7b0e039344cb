"""Packaging for ckptmerge: restore TensorFlow variables from several checkpoints at once."""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent

setup(
    name="ckptmerge",
    version="0.1.0",
    description="Restore TensorFlow variables from several checkpoints at once, with a plan first.",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    packages=find_packages(include=["ckptmerge", "ckptmerge.*"]),
    package_data={"ckptmerge": ["py.typed"]},
    install_requires=[
        "tensorflow>=2.16",
        "numpy>=1.23",
        "click>=8.0",
        "PyYAML>=5.4",
        # Reasons in docs/dependencies.md: TF-free reading and writing of checkpoints.
        "crc32c>=2.3",
        "cramjam>=2.6",
        "ml_dtypes>=0.3",
        "h5py>=3.0",
        "scipy>=1.6",  # structural alignment: linear_sum_assignment
        "tomli>=1.1; python_version < '3.11'",
        # User patterns run in linear time (docs/dependencies.md).
        "google-re2>=1.1",
    ],
    extras_require={
        # Object storage (docs/remote.md): fsspec and each store's own filesystem.
        "s3": ["fsspec>=2023.1", "s3fs>=2023.1"],
        "gcs": ["fsspec>=2023.1", "gcsfs>=2023.1"],
        "azure": ["fsspec>=2023.1", "adlfs>=2023.1"],
        "remote": ["fsspec[http]>=2023.1", "s3fs>=2023.1", "gcsfs>=2023.1", "adlfs>=2023.1"],
        # Orbax (JAX) checkpoints, read and written without JAX (docs/formats.md).
        "orbax": ["tensorstore>=0.1.60", "msgpack>=1.0"],
        "test": ["pytest>=7", "pytest-xdist>=3.5", "hypothesis>=6", "tomli-w>=1.0", "safetensors>=0.4", "jax[cpu]>=0.4",
                 "fsspec>=2023.1", "s3fs>=2023.1", "moto[server]>=5.0", "gcsfs>=2023.1", "adlfs>=2024.12",
                 # The docs site, built with --strict by tests/test_docs.py (docs/architecture.md).
                 "mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings-python>=2.0",
                 # mkdocstrings wraps the reference's signatures with ruff's formatter, when installed.
                 "ruff>=0.4",
                 # The cross-framework tests (tests/test_xframe_*.py) read KerasHub's converters.
                 "keras-hub>=0.32",
                 "tensorstore>=0.1.60", "msgpack>=1.0", "orbax-checkpoint>=0.12.8"],
    },
    entry_points={"console_scripts": ["ckptmerge=ckptmerge.__main__:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
