"""Test matrix: `nox` runs lint, the tests on tensorflow, jax and torch,
the package check, the docs and the GPU check's CPU dry run, concurrently
(`nox -j 1`: one after another, with live output).

Each backend gets its own virtualenv holding only that backend (CPU builds),
with KERAS_BACKEND set. `nox -s slow` runs the slow tests, `nox -s examples`
the examples and the offline suite in smoke mode, `nox -s bench` the
benchmarks.
"""

import glob
import os
import shutil
import tarfile
import zipfile

import nox

nox.needs_version = ">=2026.10.20"  # `parallel` and `allow_parallel`
# The default sessions, longest work first: JAX's tests (the most CPU) hold
# one core from the start while the others, yielding to them
# (`_yield_to_jax`), share the rest. One more at a time than there are
# cores (3 on 2): more processes than that only time-slice, and each then
# runs slower. Measured on a fresh clone, 2 cores: all ten at once under
# `nice 5`, 21 min 52 s and 38.7 CPU-minutes; three at a time, JAX first,
# the others yielding, 16 min 59 s and 33.1 (JAX's tests then had a core).
nox.options.sessions = [
    "tests(backend='jax')",
    "tests(backend='tensorflow')",
    "tests(backend='torch')",
    "export",
    "docs",
    "gpu",
    "package",
    "lint",
]
CORES = (
    len(os.sched_getaffinity(0))
    if hasattr(os, "sched_getaffinity")
    else os.cpu_count() or 2
)
nox.options.parallel = CORES + 1
nox.options.reuse_existing_virtualenvs = True
# uv installs in seconds what pip takes minutes to (`pip install nox uv`);
# without uv, nox falls back to virtualenv and pip.
nox.options.default_venv_backend = "uv|virtualenv"

BACKENDS = ["tensorflow", "jax", "torch"]
# CPU builds. torch==2.13.0 resolves to the CPU wheel in the local wheel
# folder; an unpinned torch pulls a multi-GB CUDA build.
BACKEND_PINS = {
    "tensorflow": ["tensorflow-cpu"],
    "jax": ["jax"],
    "torch": ["torch==2.13.0"],
}
WHEELS = "/opt/wheels"


def _find_links():
    return ["--find-links", WHEELS] if os.path.isdir(WHEELS) else []


def _install(session, backend, extras, hub=False):
    session.install(*_find_links(), *BACKEND_PINS[backend])
    session.install(*_find_links(), "-e", f".[{extras}]")
    if hub:
        # keras-hub's metadata pulls tensorflow-text and with it TensorFlow;
        # its runtime needs only the `[hub]` extra (installed above), and
        # grain to preprocess a task's inputs (strings, images) where there
        # is no tf.data.
        session.install("--no-deps", "keras-hub")
        if backend != "tensorflow":
            session.install("grain")


XLA_FAST_COMPILE = " ".join(
    [
        "--xla_backend_optimization_level=0",
        "--xla_llvm_disable_expensive_passes=true",
        "--xla_cpu_use_fusion_emitters=false",
    ]
)


def _env(backend, fast_compile=False):
    env = {
        "KERAS_BACKEND": backend,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "CUDA_VISIBLE_DEVICES": "",
        # Bytecode written into the session's virtualenv where the caller
        # sets PYTHONDONTWRITEBYTECODE (this CI does): the scripts the tests
        # and the GPU dry run start as subprocesses then read Keras's and
        # the backend's instead of compiling them again (about 10 s each).
        "PYTHONDONTWRITEBYTECODE": None,
    }
    if backend in ("jax", "tensorflow") and fast_compile:
        # XLA compiles every eager JAX op anew for each shape (most of the
        # JAX test time) and every jit-compiled TensorFlow step: the tests
        # are small, so compile fast rather than well (no LLVM optimisation,
        # the older CPU emitters: a third less test time on both).
        env["XLA_FLAGS"] = XLA_FAST_COMPILE
    return env


# The default sessions run at once on a few cores: each process computes on
# one thread. The tests' tensors are tiny, and a backend's thread pool per
# process (OpenMP, Eigen, XLA's) only oversubscribes the cores.
ONE_THREAD = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
}
XLA_ONE_THREAD = (
    "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
)


def _one_thread(env):
    env = {**env, **ONE_THREAD}
    env["XLA_FLAGS"] = " ".join(
        filter(None, [env.get("XLA_FLAGS"), XLA_ONE_THREAD])
    )
    return env


YIELD_NICE = 10


def _yield_to_jax():
    """Lowers this session's CPU priority, under `nox`'s parallel run only,
    so that JAX's tests (the most CPU work: eager JAX compiles every op for
    every shape) keep a core and end with the others rather than alone.

    Each parallel session is a process session of its own, and Linux with
    autogroups (`/proc/sys/kernel/sched_autogroup_enabled`, on here)
    shares the CPUs between those groups equally whatever `nice` says: the
    group's own niceness (`/proc/self/autogroup`) is what counts. Before
    this, `nice -n 5` on the commands left JAX's tests a third of the two
    cores beside two other sessions.
    """
    if os.getsid(0) != os.getpid():
        return  # `nox -s ...` in the caller's terminal: nothing beside it
    os.nice(YIELD_NICE)
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(YIELD_NICE))
    except OSError:  # no autogroups: the process's niceness counts
        pass


@nox.session(allow_parallel=True)
def lint(session):
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(allow_parallel=True)
@nox.parametrize("backend", BACKENDS)
def tests(session, backend):
    if backend != "jax":
        _yield_to_jax()
    _install(session, backend, "test,hub", hub=True)
    env = _one_thread(_env(backend, fast_compile=True))
    session.run("pytest", "-q", *session.posargs, env=env)


# What converts to ONNX on each backend (torch's exporter is its own), and
# TensorFlow beside JAX for the SavedModel (jax2tf).
EXPORTERS = {
    "tensorflow": ["tf2onnx", "ai-edge-litert"],
    "jax": ["jax2onnx", "tensorflow-cpu"],
    "torch": [],
}


def _install_exporters(session, backend, extras):
    _install(session, backend, extras, hub=True)
    if EXPORTERS[backend]:
        session.install(*_find_links(), *EXPORTERS[backend])


@nox.session(allow_parallel=True)
@nox.parametrize("backend", BACKENDS)
def export(session, backend):
    """The modes that reach every exporter workaround, exported with each
    format Keras offers on the backend and served by the format's runtime
    (tests/export); `nox -s slow` serves the other modes."""
    _yield_to_jax()
    _install_exporters(session, backend, "test,export,hub")
    session.run(
        "pytest", "-q", "-m", "export and not slow", "tests/export",
        *session.posargs, env=_one_thread(_env(backend, fast_compile=True)),
    )  # fmt: skip


# Run in a fresh venv holding only the wheel and torch, outside the repo.
WHEEL_SMOKE = """
import keras, numpy as np, keras_svr_attention as ksa
assert "site-packages" in ksa.__file__, ksa.__file__
x = np.random.default_rng(0).normal(size=(2, 6, 8)).astype("float32")
mha = keras.layers.MultiHeadAttention(2, 4)
layer = ksa.SVRAttention(num_heads=2, key_dim=4)
mha(x, x), layer(x, x)
layer.set_weights(mha.get_weights())
got, want = (keras.ops.convert_to_numpy(f(x, x)) for f in (layer, mha))
np.testing.assert_allclose(got, want, atol=1e-5)
print("wheel OK:", ksa.__version__, ksa.AttentionBNSH(2, 4)(x, x).shape)
"""


@nox.session(allow_parallel=True)
def package(session):
    """sdist and wheel: twine check, library-only wheel, fresh install."""
    _yield_to_jax()
    session.install("build[uv]", "twine")
    uv = ["--installer", "uv"] if session.venv_backend == "uv" else []
    tmp = os.path.abspath(session.create_tmp())
    dist = os.path.join(tmp, "dist")
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", *uv, "--outdir", dist, silent=True)
    files = sorted(glob.glob(os.path.join(dist, "*")))
    session.run("twine", "check", "--strict", *files)
    (wheel,) = [f for f in files if f.endswith(".whl")]
    names = zipfile.ZipFile(wheel).namelist()
    stray = [
        n
        for n in names
        if not n.startswith(("keras_svr_attention/", "keras_svr_attention-"))
    ]
    if stray or not any(n.endswith("svr_attention.py") for n in names):
        session.error(f"the wheel must hold the library only: {stray}")
    venv = os.path.join(tmp, "fresh-venv")
    shutil.rmtree(venv, ignore_errors=True)
    session.run("python", "-m", "venv", "--without-pip", venv)
    python = os.path.join(venv, "bin", "python")
    # uv (or pip) installs into that interpreter's environment.
    session.install(
        "--python", python, *_find_links(), wheel, *BACKEND_PINS["torch"]
    )
    session.chdir(tmp)  # away from the source tree
    session.run(
        python,
        "-c",
        WHEEL_SMOKE,
        env=_env("torch"),
        external=True,
    )


KATEX = "katex@0.19.1"


@nox.session(allow_parallel=True)
def docs(session):
    """The site, built strictly (a warning, a broken link, a public name
    without a docstring or an API page fails), then opened in headless
    Chromium (tests/docs; `-- screenshots` keeps a PNG of each page).
    KaTeX comes from npm into docs/assets/katex, so the site typesets its
    equations offline. Open site/index.html after."""
    _yield_to_jax()
    session.install("-e", ".[docs]")
    tmp = os.path.abspath(session.create_tmp())
    katex = os.path.join("docs", "assets", "katex")
    if not os.path.isfile(os.path.join(katex, "katex.min.js")):
        with session.chdir(tmp):
            session.run_install("npm", "pack", "--silent", KATEX, external=True)
        (tarball,) = glob.glob(os.path.join(tmp, "katex-*.tgz"))
        with tarfile.open(tarball) as f:
            f.extractall(tmp, filter="data")
        shutil.copytree(os.path.join(tmp, "package", "dist"), katex)
        for path in glob.glob(os.path.join(katex, "*")):
            if not path.endswith((".min.js", ".min.css", "fonts", "contrib")):
                os.remove(path)
    env = {"NO_MKDOCS_2_WARNING": "1"}
    session.run("mkdocs", "build", "--strict", env=env)
    # `nox -s docs -- screenshots`: a PNG of each page too (one more
    # Chromium run a page, half the session's CPU; CI leaves them out).
    env = {"KSA_DOCS_SITE": "site"}
    if "screenshots" in session.posargs:
        env["KSA_DOCS_SCREENSHOTS"] = os.path.join(tmp, "screenshots")
    session.run(
        "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
        "-m", "docs", "tests/docs", env=env,
    )  # fmt: skip
    session.log(f"site: site/index.html {env.get('KSA_DOCS_SCREENSHOTS', '')}")


@nox.session(allow_parallel=True)
def gpu(session):
    """The GPU check's CPU dry run (the real one: benchmarks/gpu.sh), in
    `nox`'s default sessions beside the tests."""
    _yield_to_jax()
    _install(session, "torch", "examples")
    _gpu_dry_run(session)


def _gpu_dry_run(session):
    tmp = session.create_tmp()
    docs = os.path.join(tmp, "results.md")
    shutil.copy("docs/results.md", docs)
    session.run(
        "python", "benchmarks/gpu.py", "--dry-run",
        *("--docs", docs, "--output", tmp), env=_one_thread(_env("torch")),
    )  # fmt: skip
    with open(docs) as f:
        if "CPU dry run" not in f.read():
            session.error("the dry run did not write the docs' GPU rows")


@nox.session
def floor(session):
    """The tests at the Keras floor of pyproject.toml (torch backend)."""
    _install(session, "torch", "test")
    session.install("keras==3.9.0")
    session.run("pytest", "-q", *session.posargs, env=_env("torch"))


@nox.session
@nox.parametrize("backend", BACKENDS)
def examples(session, backend):
    """Every example and the offline suite in smoke mode (1 epoch)."""
    _install(session, backend, "examples,hub", hub=True)
    env = _env(backend)
    tmp = session.create_tmp()

    def example(script, *args, **kwargs):
        return session.run(
            "python", f"examples/{script}.py", "--smoke", *args, env=env,
            **kwargs,
        )  # fmt: skip

    example("timeseries_classification", "--output", f"{tmp}/ts")
    example(
        "convert_pretrained",
        *("--model", f"{tmp}/ts/softmax_seed0.keras"),
        *("--output", f"{tmp}/convert"),
    )
    example("image_classification", "--output", f"{tmp}/image")
    example(
        "image_augmentation", "--attention", "bn+sh", "--output", f"{tmp}/aug"
    )
    if backend in ("jax", "tensorflow"):  # two virtual host devices
        log = example(
            "data_parallel",
            *("--host-devices", "2", "--output", f"{tmp}/dp"),
            silent=True,
        )
        print(log)
        if log is not None and "data parallel over 2 devices" not in log:
            session.error("data_parallel.py did not use two devices")
    # The language-model studies: uptraining after conversion, and recall.
    example("lm_uptraining", "--output", f"{tmp}/lm")
    example("mqar", "--output", f"{tmp}/mqar")
    suite = ["benchmarks/offline_suite.py", "--smoke", "--output", tmp]
    suite += ["--datasets", "UnitTest", "--seeds", "2", "--candidates", "2"]
    session.run("python", *suite, env=env)  # runs, then reports
    session.run("python", *suite, "--report", env=env)  # all cached
    if backend == "tensorflow":
        session.install("keras-cv")
        example(
            "image_augmentation",
            *("--augment", "keras-cv", "--attention", "sh"),
            *("--output", f"{tmp}/kcv"),
        )


@nox.session
@nox.parametrize("backend", BACKENDS)
def bench(session, backend):
    """FLOPs/memory (XLA, jax), speed against MHA, augmentation cost,
    decoding cost per token (every mode's state against key/value caches),
    a converted LM's cache against its key/value cache."""
    _install(session, backend, "examples,hub", hub=True)
    out = "benchmarks/results"
    env = _env(backend)
    if backend == "jax":
        session.run(
            "python",
            "benchmarks/flops.py",
            "--output",
            out,
            *session.posargs,
            env=env,
        )
    session.run("python", "benchmarks/speed.py", "--output", out, env=env)
    session.run(
        "python", "benchmarks/augmentation.py", "--output", out, env=env
    )
    session.run("python", "benchmarks/decoding.py", "--output", out, env=env)
    session.run("python", "benchmarks/lm_cache.py", "--output", out, env=env)


@nox.session
@nox.parametrize("backend", BACKENDS)
def slow(session, backend):
    # KerasHub: the family cases TensorFlow and JAX run here only
    # (`slow_off_torch`, tests/testing.py); the exporters: the modes of the
    # export grid that `nox -s export` leaves out.
    _install_exporters(session, backend, "test,export,examples,hub")
    # SVR_FUZZ_EXAMPLES: the property-based test draws many more examples.
    env = {**_env(backend, fast_compile=True), "SVR_FUZZ_EXAMPLES": "300"}
    session.run(
        "pytest", "-q", "-m", "slow and not export", *session.posargs, env=env
    )
    session.run(
        "pytest", "-q", "-m", "export and slow", "tests/export", env=env
    )
    if backend == "torch":
        # The tests that compile a train step (their mark,
        # tests/testing.py), on inductor; the default run uses aot_eager
        # (tests/conftest.py).
        session.run(
            "pytest", "-q", "-m", "compiles_the_train_step",
            env={**env, "KSA_TORCH_INDUCTOR": "1"},
        )  # fmt: skip
    if backend != "jax":  # JAX runs it above, as a slow test
        session.run(
            "pytest",
            "-q",
            "tests/layers/test_robustness.py",
            "-k",
            "blind_rows",
            env=env,
        )
