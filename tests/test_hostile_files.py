"""The files a user gives and the folders a job writes, hostile or careless: refused in one line naming the thing
and the fix (exit 2), never an internal error, never a silent last-value-wins or a second job over the first."""

import json
import os
import subprocess
import sys

import pytest

from tunebench.store import default_store_path
from tunebench.trainer import output


def _one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tunebench: error: "), err
    assert all(n in lines[0] for n in needles), err
    assert len(lines[0]) < 2200 and "Traceback" not in err


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{k}: &{k} [{', '.join([f'*{p}'] * 9)}]\n" for p, k in zip("abcdefgh", "bcdefghi")) + "tag: *i\n"


@pytest.mark.parametrize("text,needles", [
    ("model: tiny-llama\nbatch_size: 2\nbatch_size: 4\n", ("'batch_size' twice", "lines 2 and 3")),
    ("model: tiny-llama\nlora_targets: &t [q_proj]\ntag: *t\nsteps: 30\nsteps: 40\n", ("'steps' twice",)),
    (BOMB, ("expands to more than",)),
    ("model: " + "[" * 5000 + "]" * 5000 + "\n", ("nests more than",)),
    ("model: tiny-llama\nbatch_size: [1\n", ("not valid YAML", "line")),
    ("x: " + "y" * (2 << 20) + "\n", ("larger than",)),
])
def test_config_files_are_read_with_limits(tb, tmp_path, text, needles):
    (tmp_path / "c.yaml").write_text(text)
    for command in (["plan", str(tmp_path / "c.yaml"), "--gpu", "H100"], ["run", str(tmp_path / "c.yaml")]):
        code, _, err = tb(*command)
        _one_line(code, err, "c.yaml", *needles)


def test_a_suite_and_a_price_sheet_too(tb, tmp_path):
    (tmp_path / "s.yaml").write_text("name: s\nbase: {model: tiny-llama}\nruns: [{}]\nname: t\n")
    _one_line(*tb("sweep", str(tmp_path / "s.yaml"), "--dry-run")[::2], "'name' twice")
    (tmp_path / "p.yaml").write_text("offerings: []\nofferings: []\n")
    from tunebench.errors import UserError
    from tunebench.report.cost import load_prices

    with pytest.raises(UserError, match="'offerings' twice"):
        load_prices(tmp_path / "p.yaml")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_config_that_is_a_pipe_is_refused_without_blocking(tb, tmp_path):
    os.mkfifo(tmp_path / "c.yaml")
    _one_line(*tb("plan", str(tmp_path / "c.yaml"), "--gpu", "H100")[::2], "not a regular file")


def test_store_and_cache_paths_expand_as_a_shell_would(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TUNEBENCH_STORE", "~/x/results.db")
    assert default_store_path() == tmp_path / "x" / "results.db"
    monkeypatch.setenv("TUNEBENCH_CACHE", "$HOME/cache")
    from tunebench.data.prepare import cache_root

    assert str(cache_root()).startswith(str(tmp_path / "cache"))


def test_abbreviated_flags_are_not_taken_for_others(tb):
    code, _, err = tb("run", "--nnod", "4")
    _one_line(code, err, "--nnod")


def test_a_world_size_beyond_any_cluster_is_refused(tb):
    _one_line(*tb("plan", "--model", "llama-3-8b", "--gpu", "H100", "--compare", "--gpus", "1,100000000")[::2],
              "100,000,000 GPUs")


@pytest.mark.parametrize("flags,needle", [
    (["--output-dir", ""], "output_dir is empty"),
    (["--output-dir", "out", "--resume", "latest", "--overwrite"], "overwrite deletes the checkpoints"),
])
def test_train_refuses_an_output_it_would_lose(tb, tmp_path, flags, needle):
    (tmp_path / "d.txt").write_text("hello\n")
    _one_line(*tb("train", "--data", str(tmp_path / "d.txt"), "--device", "cpu", *flags)[::2], needle)


def test_a_second_job_into_one_output_dir_is_refused_naming_the_first(tb, tmp_path):
    (tmp_path / "d.txt").write_text("hello world\n" * 50)
    out = tmp_path / "out"
    argv = ["train", "--model", "tiny-llama", "--tokenizer", str(tmp_path / "none"), "--data", str(tmp_path / "d.txt"),
            "--device", "cpu", "--output-dir", str(out), "--no-store"]
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
                               "from tunebench.trainer.output import locked\nwith locked(Path(sys.argv[1])):\n"
                               "    print('held', flush=True); time.sleep(60)", str(out)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        _one_line(*tb(*argv)[::2], "a training job is running there", f"pid {holder.pid}")
    finally:
        holder.kill()
        holder.wait()
    with output.locked(out):  # the dead holder's lock went with it
        pass


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file permissions")
def test_an_output_dir_that_cannot_be_written_is_refused_before_any_work(tb, tmp_path):
    (tmp_path / "d.txt").write_text("hello\n")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        code, _, err = tb("train", "--data", str(tmp_path / "d.txt"), "--device", "cpu", "--output-dir",
                          str(ro / "out"), "--no-store")
        _one_line(code, err, "cannot write there")
    finally:
        ro.chmod(0o700)


@pytest.fixture
def one_result(tb, tmp_path):
    from conftest import run_json

    store = tmp_path / "r.db"
    run_json(tb, store)
    return store


def test_exports_never_replace_a_link_or_a_device(tb, tmp_path, one_result):
    (tmp_path / "real.csv").write_text("old\n")
    (tmp_path / "link.csv").symlink_to("real.csv")
    assert tb("results", "export", "--format", "csv", "-o", str(tmp_path / "link.csv"), "--store", str(one_result))[0] == 0
    assert (tmp_path / "link.csv").is_symlink() and "tokens_per_s" in (tmp_path / "real.csv").read_text()
    assert tb("results", "export", "--format", "jsonl", "-o", "/dev/null", "--store", str(one_result))[0] == 0
    assert not os.path.isfile("/dev/null")
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "pipe"
        os.mkfifo(fifo)
        reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
        assert tb("results", "export", "--format", "jsonl", "-o", str(fifo), "--store", str(one_result))[0] == 0
        assert '"schema_version"' in reader.communicate(timeout=30)[0] and not fifo.is_file()


def test_deep_json_and_unsigned_markers_are_not_read(tb, tmp_path, one_result):
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "deep.jsonl").write_text(deep + "\n")
    code, _, err = tb("compare", str(tmp_path / "deep.jsonl"), str(one_result))
    assert code == 2 and "Traceback" not in err and "internal error" not in err, err
    from tunebench.deploy.command import MARKER_BEGIN, MARKER_END, marked

    rec = tb("results", "export", "--format", "jsonl", "-o", str(tmp_path / "x.jsonl"), "--store", str(one_result))
    assert rec[0] == 0
    line = (tmp_path / "x.jsonl").read_text().splitlines()[0]
    log = tmp_path / "pod.log"
    log.write_text(f"{MARKER_BEGIN}\n{line}\n{MARKER_END}\n{marked('{' * 100_000)}\n")  # forged; deep
    code, out, err = tb("collect", str(log), "--store", str(tmp_path / "c.db"))
    assert code == 0 and "0 records found" in out and "without its checksum" in err and "internal" not in err, err


def test_a_damaged_sweep_definition_is_left_out_with_a_warning(tb, tmp_path):
    import sqlite3

    (tmp_path / "s.yaml").write_text("name: s\nbase: {model: tiny-llama, device: cpu, steps: 2, warmup: 1, seq_len: 8}"
                                     "\nruns: [{name: one}]\n")
    store = tmp_path / "r.db"
    assert tb("sweep", str(tmp_path / "s.yaml"), "--store", str(store))[0] == 0
    with sqlite3.connect(store) as db:
        (sweep_id,) = db.execute("SELECT id FROM sweeps").fetchone()
        db.execute("UPDATE sweeps SET definition = '{\"name\": \"s\", \"entr' WHERE id = ?", (sweep_id,))
    code, out, err = tb("results", "merge", str(store), "--store", str(tmp_path / "m.db"))
    assert code == 0 and "damaged" in err, err
    code, _, err = tb("report", "--sweep", sweep_id, "--out", str(tmp_path / "rep"), "--store", str(store))
    assert code == 0 and "damaged" in err, err
    _one_line(*tb("sweep", "--resume", sweep_id, "--store", str(store))[::2], "damaged")


def test_a_suite_too_large_to_run_is_refused_before_expanding(tb, tmp_path):
    axes = "\n".join(f"  {k}: [{', '.join(str(i + 1) for i in range(100))}]" for k in ("batch_size", "grad_accum",
                                                                                         "lora_rank", "seed"))
    (tmp_path / "big.yaml").write_text(f"name: big\nbase: {{model: tiny-llama}}\naxes:\n{axes}\n")
    _one_line(*tb("sweep", str(tmp_path / "big.yaml"), "--dry-run")[::2], "100,000,000 configurations")


def test_a_sweep_whose_definition_outgrows_a_configmap_is_refused_before_registering(tmp_path, monkeypatch):
    from tunebench.deploy import sweep as deploy_sweep
    from tunebench.errors import UserError

    monkeypatch.setattr(deploy_sweep, "MAX_DEFINITION_BYTES", 2_000)
    (tmp_path / "s.yaml").write_text("name: s\nbase: {model: tiny-llama}\naxes:\n  batch_size: [1, 2, 3, 4]\n")
    store = tmp_path / "r.db"
    with pytest.raises(UserError, match="ConfigMap holds at most 2,000"):
        deploy_sweep.plan(str(tmp_path / "s.yaml"), {}, 1, store, None, 1)
    assert not store.exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_a_full_disk_is_the_machines_fault_named_with_its_path(tb, one_result):
    code, _, err = tb("results", "export", "--format", "jsonl", "-o", "/dev/full", "--store", str(one_result))
    assert code == 74 and err.strip().splitlines() == [err.strip()] and "/dev/full: No space left on device" in err


@pytest.mark.parametrize("argv,needles", [
    (["sweep", "s.yaml", "--run-timeout", "nan"], ("--run-timeout", "above 0")),
    (["sweep", "s.yaml", "--dry-run", "--repeats", "99999999999"], ("--repeats", "1 to 1,000")),
    (["compare", "a.db", "b.db", "--threshold", "-1"], ("--threshold", "0 or more")),
    (["run", "--model", "tiny-llama", "--seed", "99999999999999999999"], ("seed=",)),
    (["run", "--model", "tiny-llama", "--seq-len", "true"], ("seq_len",)),
    (["results", "export", "-o", ""], ("an empty path",)),
])
def test_numbers_and_paths_out_of_any_sense_are_refused(tb, tmp_path, monkeypatch, argv, needles):
    monkeypatch.chdir(tmp_path)
    code, _, err = tb(*argv)
    assert code == 2 and all(n in err for n in needles) and "Traceback" not in err, err


def test_true_is_not_a_number_in_a_config_file(tb, tmp_path):
    (tmp_path / "c.yaml").write_text("model: tiny-llama\nseq_len: yes\n")
    _one_line(*tb("run", str(tmp_path / "c.yaml"), "--no-store")[::2], "seq_len=true", "not true/false")


@pytest.mark.parametrize("sheet,needle", [('gpu: "["\n    on_demand: 3', "not a valid pattern"),
                                          ('gpu: H100\n    on_demand: 0', "above 0"),
                                          ('gpu: H100\n    on_demand: -3', "above 0"),
                                          ('gpu: H100\n    on_demand: .nan', "above 0"),
                                          ('gpu: H100\n    on_demand: abc', "above 0"),
                                          ('gpu: ""\n    on_demand: 3', "match every GPU")])
def test_a_price_sheet_is_checked_before_any_cost_is_made(tmp_path, sheet, needle):
    from tunebench.errors import UserError
    from tunebench.report.cost import load_prices

    (tmp_path / "p.yaml").write_text(f"offerings:\n  - name: x\n    {sheet}\n")
    with pytest.raises(UserError, match=needle):
        load_prices(tmp_path / "p.yaml")


@pytest.mark.parametrize("make,needle", [(lambda p: os.symlink(p.parent / "precious.txt", p), "is a link"),
                                         (lambda p: p.mkdir(), "is a folder"),
                                         (lambda p: os.mkfifo(p), "not a regular file")])
def test_a_report_never_writes_through_what_stands_in_its_folder(tb, tmp_path, one_result, make, needle):
    (tmp_path / "precious.txt").write_text("mine")
    out = tmp_path / "rep"
    out.mkdir()
    make(out / "report.md")
    _one_line(*tb("report", "--store", str(one_result), "--out", str(out), "--force")[::2], needle)
    assert (tmp_path / "precious.txt").read_text() == "mine"


def test_model_weights_are_checked_before_they_are_trusted(tb, tmp_path):
    import shutil

    from transformers import AutoModelForCausalLM, LlamaConfig

    model = tmp_path / "m"
    AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=1, num_attention_heads=2,
                                                 num_key_value_heads=1)).save_pretrained(model)
    config = json.loads((model / "config.json").read_text())
    for key, value, said in (("hidden_size", -32, "config.json gives hidden_size = -32"),
                             ("vocab_size", 128, "config.json says vocab_size 128, but the embeddings in "
                                                 "model.safetensors have 64 rows")):  # edited by hand, or mixed up
        (model / "config.json").write_text(json.dumps(config | {key: value}))
        _one_line(*tb("run", "--model", str(model), "--device", "cpu", "--no-store")[::2], said)
    (model / "config.json").write_text(json.dumps(config))
    weights = model / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[:5000])  # a copy cut short
    _one_line(*tb("run", "--model", str(model), "--device", "cpu", "--no-store")[::2], "model.safetensors is damaged")
    weights.unlink()  # a shape alone: a benchmark may time it, a job cannot fine-tune it
    (tmp_path / "d.jsonl").write_text('{"text": "a b c"}\n' * 8)
    _one_line(*tb("train", "--model", str(model), "--tokenizer", str(model), "--data", str(tmp_path / "d.jsonl"),
                  "--device", "cpu", "--no-store", "--output-dir", str(tmp_path / "o"))[::2], "holds no weights")
    assert not (tmp_path / "o").exists()
    shutil.rmtree(model)


def test_a_store_or_a_log_that_is_not_a_file_is_named_as_such(tb, tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "empty.db").write_bytes(b"")
    _one_line(*tb("results", "list", "--store", str(tmp_path / "fifo"))[::2], "not a regular file")
    _one_line(*tb("collect", str(tmp_path / "fifo"), "--store", str(tmp_path / "r.db"))[::2], "not a regular file")
    _one_line(*tb("results", "list", "--store", str(tmp_path / "empty.db"))[::2], "an empty file")
    assert (tmp_path / "empty.db").stat().st_size == 0  # a command that reads left it as it was
