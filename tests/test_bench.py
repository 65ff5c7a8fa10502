"""`tritongrad bench` without a GPU: the arithmetic, the writers (CSV, markdown, PNG), the command's
refusals, the Liger adapters, and whole runs on the CPU with an injected timer (no real timing)."""

import argparse
import io
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from rich.console import Console

import tritongrad
from tritongrad.tools import bench, cli, sizes
from tritongrad.tools.bench import competitors, measure, plot, report

META = {"device": "Fake GPU", "torch": "2.0", "triton": "3.0", "tritongrad": "0.1.0", "liger": "",
        "copy_gbps": 3000.0, "command": "tritongrad bench fake --dtype float32 --mode bwd"}


@dataclass(frozen=True)
class FakeExample:
    """The shape of tritongrad.examples.Example that bench reads."""

    name: str
    op: object
    reference: object
    make_inputs: object
    bench_sizes: tuple
    traffic: object
    flops: object = None
    dtypes: tuple = (torch.float64, torch.float32, torch.bfloat16)


def _swiglu_ref(a, b):
    return torch.nn.functional.silu(a) * b


def _swiglu_inputs(size, device="cpu", dtype=torch.float32):
    return torch.randn(size, device=device, dtype=dtype), torch.randn(size, device=device, dtype=dtype)


def _swiglu_traffic(size, dtype):
    n = size if isinstance(size, int) else size[0] * size[1]
    item = torch.empty((), dtype=dtype).element_size()
    return {"fwd": 3 * n * item, "bwd": 5 * n * item}


@triton.jit
def _swiglu_kernel(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, a * tl.sigmoid(a) * b, mask=mask)


@tritongrad.op
def _swiglu_op(a, b):
    y = torch.empty_like(a)
    _swiglu_kernel[(triton.cdiv(a.numel(), 64),)](a, b, y, a.numel(), BLOCK=64)
    return y


def _wrong(a, b):
    return _swiglu_ref(a, b) + 1.0


def _registry(*examples):
    by_name = {e.name: e for e in examples}

    def get(name):
        return by_name[name]

    return types.SimpleNamespace(EXAMPLES=by_name, get=get)


def _args(*argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


class FakeTimer:
    """Runs fn once (so forward and backward really run, on the CPU) and returns a made-up median:
    2.0 ms for a forward, 5.0 ms when it left gradients, 0.5 ms for the copy probe."""

    def __init__(self):
        self.calls = []

    def __call__(self, fn, grad_to_none):
        for t in grad_to_none or ():
            t.grad = None
        fn()
        if grad_to_none is None:
            kind = "copy"
        else:
            kind = "fwd+bwd" if any(t.grad is not None for t in grad_to_none) else "fwd"
        self.calls.append(kind)
        return {"copy": 0.5, "fwd": 2.0, "fwd+bwd": 5.0}[kind]


def _timings():
    Timing = measure.Timing
    return [Timing(1024, "tritongrad", fwd=0.2, fwd_bwd=0.7), Timing(1024, "eager", fwd=0.1, fwd_bwd=0.5),
            Timing(1024, "liger", note="liger_kernel is not installed"),
            Timing(4096, "tritongrad", fwd=0.4, fwd_bwd=1.0), Timing(4096, "eager", fwd=0.5, fwd_bwd=1.5),
            Timing(4096, "liger", note="liger_kernel is not installed")]


def _rows(mode="bwd"):
    return report.make_rows("fake", _timings(), mode=mode, dtype_name="float32", traffic=_swiglu_traffic, flops=None,
                           meta=META)


def test_backward_is_fwd_bwd_minus_fwd():
    assert measure.backward_ms(0.2, 0.7) == pytest.approx(0.5)
    assert measure.backward_ms(None, 0.7) is None and measure.backward_ms(0.2, None) is None
    t = measure.Timing(1024, "eager", fwd=0.1, fwd_bwd=0.5)
    assert (t.ms("fwd"), t.ms("fwd+bwd"), t.ms("bwd")) == (0.1, 0.5, pytest.approx(0.4))


def test_rows_throughput_and_ratios():
    rows = {(r["size"], r["impl"]): r for r in _rows("bwd")}
    r = rows["1024", "tritongrad"]
    assert r["ms"] == pytest.approx(0.5) and r["bwd_ms"] == pytest.approx(0.5)
    assert (r["fwd_ms"], r["fwd_bwd_ms"]) == (0.2, 0.7)
    assert r["bytes"] == 5 * 1024 * 4  # traffic's "bwd"
    assert r["gbps"] == pytest.approx(5 * 1024 * 4 / 0.5e-3 / 1e9)
    assert r["copy_pct"] == pytest.approx(100 * r["gbps"] / 3000.0)
    assert r["vs_best"] == pytest.approx(0.5 / 0.4)  # against eager's 0.4, the fastest other
    assert rows["1024", "eager"]["vs_best"] == pytest.approx(0.4 / 0.5)
    failed = rows["1024", "liger"]
    assert failed["ms"] is None and failed["gbps"] is None and "not installed" in failed["note"]
    both = {(r["size"], r["impl"]): r for r in _rows("fwd+bwd")}
    assert both["4096", "eager"]["bytes"] == (3 + 5) * 4096 * 4  # fwd+bwd moves the sum
    assert both["4096", "eager"]["ms"] == 1.5


def test_csv_round_trip(tmp_path):
    rows = _rows()
    report.write_csv(rows, tmp_path / "fake-float32-bwd.csv")
    text = (tmp_path / "fake-float32-bwd.csv").read_text()
    assert text.splitlines()[0] == ",".join(report.FIELDS)
    back = report.read_csv(tmp_path / "fake-float32-bwd.csv")
    assert len(back) == len(rows)
    for got, want in zip(back, rows, strict=True):
        for key in report.FIELDS:
            if key in report.NUMERIC and want[key] is not None:
                assert got[key] == pytest.approx(want[key])
            else:
                assert got[key] == ("" if want[key] is None else str(want[key])) or got[key] == want[key]
    assert {r["device"] for r in back} == {"Fake GPU"} and {r["mode"] for r in back} == {"bwd"}
    assert report.read_folder(tmp_path) == back
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")  # not a benchmark CSV: ignored
    assert report.read_folder(tmp_path) == back


def test_markdown_tables():
    text = report.markdown(_rows("bwd") + _rows("fwd+bwd"))
    assert "### bwd, float32" in text and "### fwd+bwd, float32" in text
    assert "    tritongrad bench fake --dtype float32 --mode bwd" in text
    assert "Fake GPU, torch 2.0, triton 3.0, tritongrad 0.1.0; copy bandwidth 3000 GB/s" in text
    lines = text.splitlines()
    assert "| example | size | tritongrad | liger | eager |" in lines
    summary = next(line for line in lines if line.startswith("| fake | 1024 |"))
    assert summary.startswith("| fake | 1024 | 0.500 (") and summary.endswith("| - | 0.400 (0%) |")
    assert "| 1024 | liger | - | - | - | - | liger_kernel is not installed |" in lines
    tables = [line for line in lines if line.startswith("|")]
    assert all(line.endswith("|") and line.count("|") >= 4 for line in tables)


def test_rich_table_renders():
    console = Console(file=io.StringIO(), width=160)
    console.print(report.rich_table(_rows()))
    out = console.file.getvalue()
    assert "fake · float32 · bwd" in out and "liger_kernel is not installed" in out and "0.500" in out


def test_plot_png(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    path = tmp_path / "fake-float32-bwd.png"
    assert plot.write_plot(_rows(), path)
    image = Image.open(path)
    assert image.size[0] > 300 and image.size[1] > 200
    colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 10  # lines, text, not a blank canvas


def test_replot_from_csv(tmp_path):
    report.write_csv(_rows("bwd"), tmp_path / "fake-float32-bwd.csv")
    report.write_csv(_rows("fwd+bwd"), tmp_path / "fake-float32-fwd+bwd.csv")
    console = Console(file=io.StringIO())
    assert bench.main(_args("--replot", str(tmp_path)), console=console) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert "### bwd, float32" in summary and "### fwd+bwd, float32" in summary
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in console.file.getvalue()
    else:
        assert (tmp_path / "fake-float32-bwd.png").stat().st_size > 1000
        assert (tmp_path / "fake-float32-fwd+bwd.png").exists()
    assert bench.main(_args("--replot", str(tmp_path / "empty")), console=console) == 2


def test_plot_axis_from_sizes():
    assert plot._size_axis(["1024", "4096", "65536"]) == ([1024.0, 4096.0, 65536.0], "size", True)
    xs, label, log = plot._size_axis(["16384x1024", "16384x4096", "16384x16384"])
    assert xs == [1024.0, 4096.0, 16384.0] and label == "16384xN" and log
    xs, label, _ = plot._size_axis(["8x1024", "16x4096"])
    assert xs == [8192.0, 65536.0] and label == "elements"
    assert plot._size_axis(["small", "large"]) == ([0, 1], "size", False)
    # attention's sizes, causal and not (a trailing 0): no element counts to place them by
    assert plot._size_axis(["16x4096x64", "16x4096x64x0"]) == ([0, 1], "size", False)


def test_sizes_parse():
    assert sizes.parse_size("4096") == 4096
    assert sizes.parse_size("16384x4096") == (16384, 4096)
    assert sizes.format_size((16384, 4096)) == "16384x4096" and sizes.format_size(4096) == "4096"
    with pytest.raises(argparse.ArgumentTypeError):
        sizes.parse_size("big")


def test_cli_without_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(bench, "_registry", lambda: _registry(FakeExample("fake", None, None, None, (), None)))
    assert cli.main(["bench", "fake"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA GPU" in err[0] and "--replot" in err[0]


def test_cli_interpreter_is_no_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert bench.gpu_device() is None


def test_unknown_example(monkeypatch, capsys):
    registry = _registry(*(FakeExample(n, None, None, None, (), None) for n in ("rmsnorm", "softmax", "cross_entropy")))
    monkeypatch.setattr(bench, "_registry", lambda: registry)
    assert cli.main(["bench", "rmsnorm", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tritongrad bench: unknown example 'nope' (examples: rmsnorm, softmax, cross_entropy; or name "
                   "FILE.py:OP)"]
    assert [e.name for e in bench.resolve(["cross-entropy"], registry)] == ["cross_entropy"]
    assert cli.main(["bench"]) == 2
    capsys.readouterr()
    assert bench.main(_args("rmsnorm"), registry=registry, device="cpu", timer=FakeTimer()) == 2
    assert capsys.readouterr().err.strip() == "tritongrad bench: rmsnorm has no BENCH_SIZES; pass --sizes"


def test_command_line_recorded():
    args = _args("rmsnorm", "softmax", "--sizes", "16384x4096", "--mode", "bwd", "fwd+bwd", "--impl", "eager")
    assert bench.command_line(args) == ("tritongrad bench rmsnorm softmax --dtype bfloat16 --sizes 16384x4096 "
                                        "--mode bwd fwd+bwd --impl eager")
    assert bench.command_line(_args("softmax", "--graphs")).endswith("--mode fwd+bwd --graphs")


def test_graphs_run_is_labelled_apart(tmp_path, monkeypatch):
    """--graphs rows (CUDA-graph replays) go to files, tables and summary sections of their own, beside eager ones;
    the graph timer itself needs a GPU (test_op_gpu); here an injected timer stands in for it."""
    monkeypatch.setattr(measure, "COPY_BYTES", 2**20)
    example = FakeExample("fake", _swiglu_ref, _swiglu_ref, _swiglu_inputs, (64,), _swiglu_traffic)
    for extra in ((), ("--graphs",)):
        rc, _, out = _run(tmp_path, [example], "--dtype", "float32", "--mode", "bwd", "--impl", "eager", *extra)
        assert rc == 0
    assert "fake · float32 · bwd · CUDA graphs" in out and "CUDA-graph replays" in out
    eager = report.read_csv(tmp_path / "fake-float32-bwd.csv")
    graphs = report.read_csv(tmp_path / "fake-float32-bwd-graphs.csv")
    assert {r["timing"] for r in eager} == {report.EAGER} and {r["timing"] for r in graphs} == {report.GRAPHS}
    assert {r["command"] for r in graphs} == {"tritongrad bench fake --dtype float32 --mode bwd --impl eager --graphs"}
    summary = (tmp_path / "summary.md").read_text()
    assert "### bwd, float32\n" in summary and "### bwd, float32, CUDA graphs\n" in summary


def test_csvs_without_a_timing_column_are_eager(tmp_path):
    """CSVs written before the timing column was added still replot (as eager launches)."""
    rows = _rows()
    fields = [f for f in report.FIELDS if f != "timing"]
    (tmp_path / "fake-float32-bwd.csv").write_text(
        ",".join(fields) + "\n" + "".join(",".join("" if r[f] is None else str(r[f]) for f in fields) + "\n"
                                          for r in rows))
    back = report.read_folder(tmp_path)
    assert len(back) == len(rows) and {r["timing"] for r in back} == {""}
    assert "### bwd, float32\n" in report.markdown(back)
    assert bench.main(_args("--replot", str(tmp_path)), console=Console(file=io.StringIO())) == 0


def _fake_liger(monkeypatch, **attributes):
    """A stand-in liger_kernel package (the real one launches CUDA kernels only)."""
    calls = []

    class Function:
        @staticmethod
        def apply(*args):
            calls.append(args)
            return args[0] * 2

    for name, module_name in (("liger_kernel", None), ("liger_kernel.ops", None),
                              ("liger_kernel.ops.rms_norm", "rms_norm"), ("liger_kernel.ops.softmax", "softmax")):
        module = types.ModuleType(name)
        if module_name in attributes:
            setattr(module, attributes[module_name], Function)
        monkeypatch.setitem(sys.modules, name, module)
    return calls


def test_liger_adapters_are_import_guarded(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # not installed: importing it raises ImportError
    for table in (competitors.LIGER, competitors.LIGER_FWD):
        for name in table:
            assert competitors.liger_adapter(table, name) == (None, "liger_kernel is not installed")
    assert competitors.liger_adapter(competitors.LIGER, "matmul") == (None, "Liger-Kernel has no counterpart of matmul")
    impls = competitors.implementations(FakeExample("rmsnorm", None, _swiglu_ref, None, (), None), None, "float32")
    assert [(i.name, i.make is None, i.note) for i in impls] == [
        ("tritongrad", False, ""), ("liger-fwd", True, "liger_kernel is not installed"),
        ("liger", True, "liger_kernel is not installed"), ("compile", False, ""), ("eager", False, "")]
    sin = FakeExample("sin", None, _swiglu_ref, None, (), None)
    assert [i.name for i in competitors.implementations(sin, None, "float32")] == ["tritongrad", "compile", "eager"]


def test_liger_adapter_calls_with_reference_signature(monkeypatch):
    calls = _fake_liger(monkeypatch, rms_norm="LigerRMSNormFunction")
    fn, note = competitors.liger_adapter(competitors.LIGER, "rmsnorm")
    assert note == "" and fn(torch.ones(2), torch.ones(2)).tolist() == [2.0, 2.0]
    assert calls[-1][2] == 1e-6
    fn(torch.ones(2), torch.ones(2), 1e-5)
    assert calls[-1][2] == 1e-5
    fn, note = competitors.liger_adapter(competitors.LIGER, "softmax")  # the module lacks LigerSoftmaxFunction
    assert fn is None and "has no liger_kernel.ops.softmax.LigerSoftmaxFunction" in note
    assert competitors.liger_adapter(competitors.LIGER, "rms-norm")[1] == ""  # other spellings of a name


def test_real_liger_has_every_adapted_function():
    pytest.importorskip("liger_kernel")
    for table in (competitors.LIGER, competitors.LIGER_FWD):
        for name in table:
            fn, note = competitors.liger_adapter(table, name)
            assert fn is not None, note


def _run(tmp_path, examples, *argv):
    timer = FakeTimer()
    console = Console(file=io.StringIO(), width=200)
    args = _args(*[e.name for e in examples], "--out", str(tmp_path), *argv)
    rc = bench.main(args, registry=_registry(*examples), device="cpu", timer=timer, console=console)
    return rc, timer, console.file.getvalue()


def test_run_on_cpu_with_fake_timer(tmp_path, monkeypatch):
    monkeypatch.setattr(measure, "COPY_BYTES", 2**20)

    def flaky(a, b):
        if a.shape[0] > 100:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        return _swiglu_ref(a, b)

    good = FakeExample("fake", flaky, _swiglu_ref, _swiglu_inputs, (64, 200), _swiglu_traffic)
    rc, timer, out = _run(tmp_path, [good], "--dtype", "float32", "--mode", "bwd", "fwd+bwd",
                          "--impl", "tritongrad", "eager")
    assert rc == 0
    assert timer.calls[0] == "copy" and "copy bandwidth 4 GB/s" in out  # 2 MiB over 0.5 ms
    # each implementation: its forward, then forward + backward (which left gradients on every input)
    assert timer.calls[1:] == ["fwd", "fwd+bwd"] * 3
    rows = report.read_csv(tmp_path / "fake-float32-bwd.csv")
    by = {(r["size"], r["impl"]): r for r in rows}
    assert by["64", "eager"]["ms"] == pytest.approx(3.0)  # 5.0 - 2.0
    assert by["64", "tritongrad"]["gbps"] == pytest.approx(5 * 64 * 4 / 3e-3 / 1e9)
    assert by["200", "tritongrad"]["ms"] is None and by["200", "tritongrad"]["note"] == "out of memory"
    assert by["200", "eager"]["ms"] == pytest.approx(3.0) and by["200", "eager"]["vs_best"] is None
    assert {r["device"] for r in rows} == {"cpu"} and {r["command"] for r in rows} == {
        "tritongrad bench fake --dtype float32 --mode bwd fwd+bwd --impl tritongrad eager"}
    assert report.read_csv(tmp_path / "fake-float32-fwd+bwd.csv")[0]["ms"] == 5.0
    assert "### bwd, float32" in (tmp_path / "summary.md").read_text()
    assert "fake · float32 · bwd" in out and "fake · float32 · fwd+bwd" in out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in out
    else:
        assert (tmp_path / "fake-float32-bwd.png").exists()


def test_run_marks_wrong_and_unsupported_implementations(tmp_path, monkeypatch):
    monkeypatch.setattr(measure, "COPY_BYTES", 2**20)
    wrong = FakeExample("wrong", _wrong, _swiglu_ref, _swiglu_inputs, (64,), _swiglu_traffic)
    half_less = FakeExample("nohalf", _swiglu_ref, _swiglu_ref, _swiglu_inputs, (64,), _swiglu_traffic,
                            dtypes=(torch.float32,))
    rc, timer, out = _run(tmp_path, [wrong, half_less], "--dtype", "bfloat16", "--mode", "fwd",
                          "--impl", "tritongrad", "eager")
    assert rc == 0
    wrong_rows = {r["impl"]: r for r in report.read_csv(tmp_path / "wrong-bfloat16-fwd.csv")}
    assert wrong_rows["tritongrad"]["ms"] is None
    assert wrong_rows["tritongrad"]["note"].startswith("forward differs from eager")
    assert wrong_rows["eager"]["ms"] == 2.0
    nohalf = {r["impl"]: r for r in report.read_csv(tmp_path / "nohalf-bfloat16-fwd.csv")}
    assert nohalf["tritongrad"]["note"] == "the example supports float32" and nohalf["eager"]["ms"] == 2.0
    assert timer.calls == ["copy", "fwd", "fwd"]  # only the implementations that can run were timed


def test_run_with_a_derived_backward(tmp_path, monkeypatch):
    """The tritongrad implementation is an @tritongrad.op (under the interpreter without a GPU)."""
    monkeypatch.setattr(measure, "COPY_BYTES", 2**20)
    example = FakeExample("swiglu", _swiglu_op, _swiglu_ref, _swiglu_inputs, (100,), _swiglu_traffic)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    timer = FakeTimer()
    args = _args("swiglu", "--out", str(tmp_path), "--dtype", "float32", "--mode", "bwd",
                 "--impl", "tritongrad", "eager")
    assert bench.main(args, registry=_registry(example), device=device, timer=timer,
                      console=Console(file=io.StringIO())) == 0
    rows = {r["impl"]: r for r in report.read_csv(tmp_path / "swiglu-float32-bwd.csv")}
    assert rows["tritongrad"]["note"] == "" and rows["tritongrad"]["ms"] == pytest.approx(3.0)
    assert timer.calls == ["copy", "fwd", "fwd+bwd", "fwd", "fwd+bwd"]


def test_liger_fwd_is_wrapped_as_an_op(monkeypatch):
    """liger-fwd times Liger's forward launcher under @tritongrad.op (a stand-in launcher here)."""
    def rms_norm_forward(x, w, eps, offset, casting_mode, row_mode):
        return (x * w, x, None, 0, 0, casting_mode)

    _fake_liger(monkeypatch)
    monkeypatch.setattr(sys.modules["liger_kernel.ops.rms_norm"], "rms_norm_forward", rms_norm_forward,
                        raising=False)
    wrapped = []
    monkeypatch.setattr(tritongrad, "op", lambda fn: wrapped.append(fn) or fn)
    impls = competitors.implementations(FakeExample("rmsnorm", None, None, None, (), None), ["liger-fwd"], "float32")
    assert len(wrapped) == 1 and impls[0].make is not None
    assert impls[0].make()(torch.full((2,), 3.0), torch.full((2,), 2.0)).tolist() == [6.0, 6.0]


def test_real_liger_softmax_both_ways(tmp_path, monkeypatch):
    """With Liger-Kernel installed: its softmax launcher under @tritongrad.op (derived backward) and its
    autograd.Function, timed beside eager (the interpreter runs Liger's kernels without a GPU)."""
    pytest.importorskip("liger_kernel.ops.softmax")
    monkeypatch.setattr(measure, "COPY_BYTES", 2**20)

    def inputs(size, device="cpu", dtype=torch.float32):
        return (torch.randn(size, device=device, dtype=dtype),)

    example = FakeExample("softmax", None, lambda x: torch.softmax(x, -1), inputs, ((6, 300),), _swiglu_traffic)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    timer = FakeTimer()
    args = _args("softmax", "--out", str(tmp_path), "--dtype", "float32", "--mode", "bwd",
                 "--impl", "liger-fwd", "liger", "eager")
    assert bench.main(args, registry=_registry(example), device=device, timer=timer,
                      console=Console(file=io.StringIO())) == 0
    rows = {r["impl"]: r for r in report.read_csv(tmp_path / "softmax-float32-bwd.csv")}
    assert all(r["note"] == "" and r["ms"] == pytest.approx(3.0) for r in rows.values()), rows
    assert rows["liger"]["liger"]  # its version is recorded


# -- a user's own op: FILE.py:OP ------------------------------------------------------------------------------------

USER_OPS = Path(__file__).parent / "data" / "user_ops"
MY_SOFTPLUS = f"{USER_OPS / 'my_ops.py'}:my_softplus"


def test_a_users_op_is_resolved_from_its_file():
    (subject,) = bench.resolve([MY_SOFTPLUS])
    assert subject.name == "my_softplus" and subject.bench_sizes == (2**20,)
    assert subject.traffic(100, torch.float32) == {"fwd": 800, "bwd": 1200}
    # no Liger-Kernel rows unless asked for; no eager and compile rows without a reference
    assert [i.name for i in competitors.implementations(subject, None, "float32")] == ["tritongrad", "compile", "eager"]
    (bare,) = bench.resolve([f"{USER_OPS / 'no_reference.py'}:bare_softplus"])
    assert bare.reference is None and bare.traffic is None
    assert [i.name for i in competitors.implementations(bare, None, "float32")] == ["tritongrad"]
    (eager,) = competitors.implementations(bare, ["eager"], "float32")
    assert eager.make is None and eager.note == "bare_softplus has no `reference` beside it"


@pytest.mark.parametrize(("argv", "message"), [
    ([str(USER_OPS / "my_ops.py")], "expected FILE.py:OP (or a bundled example's name), got "),
    (["nothere.py:op"], "no such file: nothere.py"),
    ([f"{USER_OPS / 'my_ops.py'}:softplus_kernel"], "is a Triton kernel; name the op that launches it"),
    ([MY_SOFTPLUS, "--sizes", "3x4"], "my_softplus takes sizes of 1 number (such as 45, 130, 1048576), not 3x4"),
    ([f"{USER_OPS / 'no_reference.py'}:bare_softplus"], "bare_softplus has no BENCH_SIZES; pass --sizes"),
], ids=["no-op-name", "no-file", "a-kernel", "rank", "no-sizes"])
def test_a_users_op_mistakes_are_one_line(argv, message, capsys):
    assert bench.main(_args(*argv), device="cpu", timer=FakeTimer()) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tritongrad bench: ") and "\n" not in err and message in err, err


def test_run_a_users_op(tmp_path, monkeypatch):
    """bench FILE.py:OP: the module's make_inputs and traffic, and the rows, CSV, table and plot an example gets."""
    monkeypatch.setattr(measure, "COPY_BYTES", 2**20)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    timer = FakeTimer()
    console = Console(file=io.StringIO(), width=200)
    args = _args(MY_SOFTPLUS, "--out", str(tmp_path), "--dtype", "float32", "--mode", "bwd", "--sizes", "100",
                 "--impl", "tritongrad", "eager")
    assert bench.main(args, device=device, timer=timer, console=console) == 0
    assert timer.calls == ["copy", "fwd", "fwd+bwd", "fwd", "fwd+bwd"]
    rows = {r["impl"]: r for r in report.read_csv(tmp_path / "my_softplus-float32-bwd.csv")}
    assert set(rows) == {"tritongrad", "eager"} and all(list(r) == list(report.FIELDS) for r in rows.values())
    ours = rows["tritongrad"]
    assert ours["example"] == "my_softplus" and ours["note"] == "" and ours["ms"] == pytest.approx(3.0)
    assert ours["bytes"] == 1200 and ours["gbps"] == pytest.approx(1200 / 3e-3 / 1e9)
    assert ours["command"] == (f"tritongrad bench {MY_SOFTPLUS} --dtype float32 --sizes 100 --mode bwd --impl "
                               "tritongrad eager")
    assert "my_softplus · float32 · bwd" in console.file.getvalue()
    assert "### bwd, float32" in (tmp_path / "summary.md").read_text()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "my_softplus-float32-bwd.png").stat().st_size > 1000


def test_run_an_op_without_reference_or_traffic(tmp_path, monkeypatch):
    """Timed alone (nothing to compare its forward with); without traffic() its plot shows times."""
    monkeypatch.setattr(measure, "COPY_BYTES", 2**20)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = _args(f"{USER_OPS / 'no_reference.py'}:bare_softplus", "--out", str(tmp_path), "--dtype", "float32",
                 "--mode", "fwd+bwd", "--sizes", "100")
    assert bench.main(args, device=device, timer=FakeTimer(), console=Console(file=io.StringIO())) == 0
    (row,) = report.read_csv(tmp_path / "bare_softplus-float32-fwd+bwd.csv")
    assert row["impl"] == "tritongrad" and row["ms"] == 5.0 and row["gbps"] is None and row["note"] == ""


def test_a_compile_error_in_a_note_says_what_is_wrong():
    """Triton's compile errors start `at L:C:` and end with the error: a note keeps both lines (found on the H100,
    a user's bf16 `tl.exp`)."""
    from tritongrad.tools.bench.measure import short_error

    class CompilationError(Exception):
        pass

    error = CompilationError('at 5:40:\n    tl.store(y, tl.exp(x))\n        ^\n'
                             'ValueError("Expected dtype fp32, got bf16")')
    assert short_error(error) == 'CompilationError: at 5:40: ValueError("Expected dtype fp32, got bf16")'
