"""``pamsim bench``'s cuda case group: says why it has no rows when there is no GPU."""
import sim.benches.cuda as bench_cuda
from sim import bench


def test_cuda_group_is_registered():
    assert "cuda" in bench.load_cases()


def test_reason_matches_numba():
    from numba import config, cuda
    usable = cuda.is_available() and not config.ENABLE_CUDASIM
    reason = bench_cuda.no_device_reason()
    assert (reason is None) == usable
    if not usable:
        assert reason.strip()


def test_without_a_device_no_rows_and_one_line(monkeypatch, capsys):
    monkeypatch.setattr(bench_cuda, "no_device_reason", lambda: "CUDA driver library cannot be found.")
    assert bench_cuda.cuda_cases(quick=True) == []
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["no CUDA device: CUDA driver library cannot be found "
                   "(the cuda case group has no rows)"]
