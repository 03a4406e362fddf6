"""maelm-jax: MAE-LM, 3ML and MLM pretraining of text encoders in JAX/Flax."""
from setuptools import find_packages, setup

TPU = "jax[tpu]; platform_system == 'Linux' and platform_machine == 'x86_64'"
# gs:// workdirs (maelm_jax/core/storage.py): gcsfs is the file layer orbax's
# etils.epath uses for gs://, google-cloud-storage takes the workdir's lease.
GCS = ["gcsfs>=2024.2.0", "fsspec>=2024.2.0", "google-cloud-storage>=2.14"]

setup(
    name="maelm_jax",
    version="0.1.0",
    license="Apache-2.0",
    description="TPU-first JAX/Flax pretraining of masked-language-model encoders (MAE-LM, 3ML, MLM).",
    packages=find_packages(include=["maelm_jax", "maelm_jax.*"]),
    python_requires=">=3.11",
    # The commands, from any directory (configs/ ships inside the package).
    entry_points={"console_scripts": [
        "maelm-pretrain = maelm_jax.main:console",
        "maelm-finetune = maelm_jax.main:finetune_console",
        "maelm-prepare = maelm_jax.data.prepare_data:console",
        "maelm-blimp = maelm_jax.evaluate.blimp:console",
        "maelm-analyze = maelm_jax.evaluate.analyze:console",
        "maelm-export = maelm_jax.interop.export_hf:console",
        "maelm-import = maelm_jax.interop.import_hf:console",
        "maelm-import-fairseq = maelm_jax.interop.import_fairseq:console",
        "maelm-plan = maelm_jax.plan:console",
        "maelm-compare = maelm_jax.compare:console",
        "maelm-sweep = maelm_jax.sweep:console",
        "maelm-finetune-sweep = maelm_jax.finetune.sweep:console",
    ]},
    # Lower bounds are the versions measured to work on Python 3.11 / CPU; newer
    # releases (the GPU image runs jax 0.11) are allowed.
    install_requires=[
        "jax>=0.10.0",
        "flax>=0.12.0",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.12.0",
        "grain>=0.2.12",
        "tensorflow-datasets>=4.9.9",
        "sentencepiece>=0.2.0",
        "ml-collections>=1.0.0",
        "absl-py>=2.1.0",
        "numpy>=2.0",  # jax 0.10 needs numpy 2.
        "matplotlib>=3.8",
        # Prepared corpora (ArrayRecord shards) and parquet / Arrow inputs.
        "array-record>=0.8.1; platform_system == 'Linux'",
        "pyarrow>=15",
        # A Hugging Face tokenizer.json, for pretraining, fine-tuning and export.
        "tokenizers>=0.20",
    ],
    extras_require={
        # python -m maelm_jax.plan: libtpu compiles the run's step for TPU chips on
        # any Linux x86-64 host (the only platform it is built for), pinned by
        # jax's own `tpu` extra to the libtpu of the installed jax.
        "tpu": [TPU, *GCS],
        # python -m maelm_jax.plan --topology=h100:8: jax's CUDA plugin compiles the
        # step for described GPUs on any Linux x86-64 host, no GPU or driver needed
        # (tools/gpu_targets.py); cuDNN, for the fused attention it plans.
        "plan-gpu": ["jax[cuda12-local]", "nvidia-cudnn-cu12>=9.8,<10"],
        # Workdirs in a bucket, on any machine (`--workdir=gs://BUCKET/PATH`).
        "gcs": GCS,
        # NVIDIA GPUs: jax's CUDA wheels (CUDA 12 or 13, as the driver allows).
        "cuda12": ["jax[cuda12]"],
        "cuda13": ["jax[cuda13]"],
        # python -m maelm_jax.interop.export_hf and import_hf (safetensors files). The
        # parity checks (import_hf --check, import_fairseq) also need torch and
        # transformers, which a user installs for their platform.
        "export": ["safetensors>=0.4"],
        # notebooks/quickstart.ipynb: the export's last cell loads it with
        # transformers on PyTorch (Colab has both; elsewhere pip picks the torch
        # build for the platform, a CUDA one on Linux unless told otherwise).
        "notebook": ["safetensors>=0.4", "torch", "transformers>=4.57"],
        # Weights & Biases logging (--config.wandb_project; run/wandb_writer.py).
        "wandb": ["wandb>=0.17"],
        # The tests load exports with transformers on PyTorch. torch==2.13.0 is the
        # CPU wheel only where pip finds that wheel (the CI machine has it locally;
        # elsewhere add --index-url https://download.pytorch.org/whl/cpu, or pip
        # may pull a multi-GB CUDA build).
        # nbclient/ipykernel run notebooks/quickstart.ipynb in a real kernel.
        # import-linter checks the package's layers (.importlinter).
        # scikit-learn: the GLUE metrics' parity test (scipy comes with jax).
        # tensorboardX: its Event protocol buffers read back the event files
        # the runs write (run/tensorboard_events.py).
        # gcp-storage-emulator: the gs:// tests' GCS, on 127.0.0.1.
        # wandb: the W&B logging test, in its offline mode (tests/test_wandb.py).
        # ml_dtypes below 0.7: 0.7.0 takes 0.6 s to register its numpy loops at
        # every import of jax, against 0.005 s for 0.6.0, and every run a test
        # starts imports jax (benchmarks/test-suite-cost.md); jax asks >=0.5.
        "test": [TPU, *GCS, "gcp-storage-emulator>=2024.8", "import-linter>=2.0", "pytest>=8.0", "pytest-xdist>=3.5", "pytest-cov>=5.0",
                 "safetensors>=0.4", "torch==2.13.0", "transformers==4.57.6", "wandb>=0.17",
                 "nbclient>=0.10", "nbformat>=5.10", "ipykernel>=6.29",
                 "scikit-learn>=1.4", "tensorboardX>=2.6", "ml_dtypes>=0.5,<0.7"],
    },
)
