"""Shared test setup: CPU-only JAX (unless ``JAX_PLATFORMS`` says otherwise, e.g. ``cuda`` on
a GPU machine), and a check after every test that the receiver has processed everything
and no callback exception was left unreported."""
from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite tests asynchronous taps, what most of hostfeed's machinery (the queue, its
# bound, batches, joined taps, barriers) is about, and what its tests were written
# against: the tests of the default mode (the legacy module's: synchronous taps on CPUs and
# GPUs) choose it themselves (test_legacy_semantics.py, test_sync.py, test_install.py, the
# docstring examples and the docs' blocks). Inherited by the processes the tests start.
os.environ.setdefault("HOSTFEED_SYNC_TAPS", "0")

import pytest

from hostfeed import host_callback as hcb

#: The suite runs on a GPU (``JAX_PLATFORMS=cuda``, see ``.ci/accelerators/gpu_check.sh``).
_FIRST_PLATFORM = os.environ["JAX_PLATFORMS"].split(",")[0].strip()
#: The suite runs on a ROCm GPU (.ci/accelerators/rocm_check.sh).
ON_ROCM = _FIRST_PLATFORM == "rocm"
#: The suite runs on a GPU: CUDA (.ci/accelerators/gpu_check.sh) or ROCm.
ON_GPU = _FIRST_PLATFORM in ("cuda", "gpu") or ON_ROCM
#: Which GPU's native functions the GPU tests use (``lowering.gpu_driver``).
GPU_KIND = "rocm" if ON_ROCM else "cuda"


#: The suite runs on a TPU (``JAX_PLATFORMS=tpu``, see ``.ci/accelerators/tpu_check.sh``).
ON_TPU = _FIRST_PLATFORM == "tpu"
#: The suite runs on one accelerator (one device; CI runs the several-device tests on CPU).
ON_ACCELERATOR = ON_GPU or ON_TPU

#: The callbacks take the portable transport (JAX's host-callback lowering): forced with
#: ``HOSTFEED_TRANSPORT=jax``, or on a TPU, which has no hostfeed handlers.
PORTABLE = os.environ.get("HOSTFEED_TRANSPORT", "").strip().lower() == "jax" or ON_TPU


# ---- where each test runs ------------------------------------------------------------------
# The one list of what runs where (docs/development.md, "What runs where"). A test runs in
# every session unless it is named here: in the `tests` session of each supported JAX
# release (noxfile.py's MATRIX) and again in the `portable` one (HOSTFEED_TRANSPORT=jax).
# A test is named only where running it in fewer sessions saves time and it cannot fail
# differently there; when in doubt, it is left out of these lists and runs everywhere.
# Keys are test files; a value is ALL (the whole file) or the names of some of its tests
# (every parametrization of each). `nox -s full` runs every test in every session.

#: The whole file.
ALL = "*"

#: Tests whose outcome depends neither on the JAX release nor on the transport: what they
#: check happens on the host, after a callback has delivered its data (the Recorder's stores
#: and writers, object stores, reading back, appending) or before JAX is reached (settings,
#: arguments refused at the call), or involves no JAX at all (the docs' pages and figures,
#: the examples, the bench's report and plots, packaging, the structure, the dispatcher's
#: joining logic, the GPU driver loaders). A jitted record that only brings the rows to the
#: writer under test does not make a test JAX-facing: the JAX-facing tests check that path
#: on every release. `pytest --scope=host` runs these alone; CI runs them once, in the
#: `host` session, with the newest JAX (noxfile.py).
HOST_SIDE: dict[str, object] = {
    "test_object_store.py": ALL,
    "test_store_conformance.py": ALL,  # the storage back-ends, no JAX
    "test_append.py": ALL,
    "test_reading_back.py": ALL,
    "test_look_at_a_run.py": ALL,  # show and the TensorBoard export: stores written eagerly
    "test_live_view.py": ALL,  # the recorder's live cycles, read by follow and TensorBoard
    "test_a_reduction_of_ones_own.py": ALL,  # the reductions' seam, read back: stores eager
    # The casts' thresholds (ml_dtypes), refusals at the call, reading, drawing and exporting
    # statistics (stores written eagerly); not the rows' values on each path (JAX-facing).
    "test_stats.py": frozenset({
        "test_cast_thresholds_are_where_ml_dtypes_casts_change",
        "test_an_unknown_cast_dtype_is_refused_at_the_call",
        "test_stats_takes_each_cast_dtype_spelt_any_way_and_stats_is_stats",
        "test_a_store_with_the_earlier_nine_columns_reads_draws_and_exports",
        "test_show_and_tensorboard_draw_the_new_columns"}),
    "test_sharding.py": ALL,  # Zarr's sharded layout (not JAX's), read by three readers
    "test_docs.py": ALL,
    "test_packaging.py": ALL,
    "test_structure.py": ALL,
    "test_shard_assembly.py": ALL,
    # Not the fork (JAX's own threads at a fork) nor the byte order of a call's result (the
    # call's host side differs between transports).
    "test_recorder_integrity.py": frozenset({
        "test_rows_flushed_mid_chunk_read_back_exactly",
        "test_soak_rows_flushed_mid_chunk_read_back_exactly",
        "test_a_second_recorder_on_an_open_store_is_refused_in_process",
        "test_the_lock_holds_across_processes_and_dies_with_its_holder",
        "test_names_are_refused_before_anything_is_created",
        "test_paths_longer_than_the_system_allows_are_refused",
        "test_eager_records_raise_at_the_call",
        "test_flush_and_close_raise_the_recorders_unseen_errors",
        "test_write_failures_raise_recording_error_every_time_naming_every_array",
        "test_paths_are_taken_with_os_fspath"}),
    # The writer's errors, durability and chunks, and zarr-python's dtypes; not the rows'
    # dtypes, transformations, the queue's bound or the exit (JAX-facing).
    "test_recording.py": frozenset({
        "test_a_bad_writer_count_is_refused_at_open",
        "test_an_unwritable_or_existing_path_is_an_oserror",
        "test_a_failing_disk_is_a_recording_error_at_the_next_barrier",
        "test_rows_flushed_before_a_kill_survive_it",
        "test_flushes_in_the_middle_of_chunks",
        "test_zstd_store_reads_back_and_stats",
        "test_registered_dtypes_leave_zarr_python_working_for_other_arrays",
        "test_zarr_learns_the_ml_dtypes_whatever_the_import_order",
        "test_a_chosen_pool_limit_holds_whatever_starts_the_receiver"}),
    # The window's rows and triggers from eager records, arguments refused at the call,
    # show, a killed writer, memory, and four processes (two run on every release).
    "test_flight_recorder.py": frozenset({
        "test_a_watch_writes_the_window_and_the_steps_after_once",
        "test_keep_writes_the_window_as_it_stands_and_appending_keeps_earlier_triggers",
        "test_the_byte_bound_holds_older_steps_out_and_refuses_a_step_larger_than_it",
        "test_on_trigger_is_called_with_each_trigger_and_its_error_raised_at_the_barrier",
        "test_show_lists_the_triggers_and_the_first_non_finite_value",
        "test_bad_input_is_refused_at_the_call",
        "test_a_sigkill_while_the_window_is_written_leaves_whole_rows_or_reported_missing",
        "test_memory_stays_within_window_bytes_over_10000_steps_of_1_mib_rows",
        "test_a_trigger_in_one_of_four_processes_writes_every_window"}),
    # The object store and the lock; the processes' JAX side is the file system run's.
    "test_shared_store.py": frozenset({
        "test_processes_share_an_object_store",
        "test_another_run_on_an_open_shared_store_is_refused"}),
    # Not the exit with pending taps, the refusals at tracing and lowering, the eager
    # id_print, the jitted lambda's name (JAX-facing).
    "test_bad_settings_and_inputs.py": frozenset({
        "test_the_table_covers_every_variable",
        "test_a_bad_value_fails_the_import_naming_the_variable",
        "test_empty_values_are_unset_and_words_ignore_case",
        "test_recorder_refuses_a_coordination_timeout_that_is_not_positive",
        "test_recorder_arguments_are_refused_at_the_call_before_anything_is_written",
        "test_bench_checks_its_output_paths_before_the_run",
        "test_a_misspelt_keyword_is_named",
        "test_read_recording_names_the_store_and_the_nearest_names",
        "test_byte_counts_take_the_units_the_readme_writes",
        "test_byte_counts_refuse_what_they_cannot_read",
        "test_a_misspelt_variable_name_is_reported_at_import_with_the_nearest_name",
        "test_a_recorder_url_is_refused_before_anything_is_created_and_file_urls_work",
        "test_no_storage_option_value_reaches_a_rust_panic",
        "test_an_endpoint_that_is_no_url_is_named",
        "test_a_bad_lease_is_refused_on_a_local_path_too",
        "test_a_url_missing_a_slash_is_no_local_folder",
        "test_reading_what_hostfeed_did_not_write_says_so",
        "test_a_truncated_chunk_is_named_when_read",
        "test_follow_on_a_damaged_store_raises_at_once"}),
    # The README's commands and the demo; not the docstring examples (taps under jit).
    "test_examples.py": frozenset({
        "test_readme_has_two_commands_first",
        "test_demo_trains_records_reads_back_and_summarises",
        "test_demo_refuses_no_steps_with_its_own_usage",
        "test_readme_check_doctests",
        "test_readme_blocks_need_only_what_the_readme_installed_before_them"}),
    "test_surprises.py": frozenset({
        "test_demo_with_a_temporary_store_says_it_is_deleted",
        "test_the_exit_status_for_an_unraised_callback_error_follows_the_setting"}),
    # The report and the plots from the committed runs; not the quick run, which calls
    # JAX's own callbacks (jax.experimental.buffer_callback among them) on each release,
    # nor the receiver's timing of taps.
    "test_bench.py": frozenset({
        "test_plot_without_matplotlib_is_a_clear_error",
        "test_plot_draws_one_panel_per_section_with_data",
        "test_plot_of_a_result_with_nothing_to_draw_names_what_it_draws",
        "test_plot_of_sections_with_nothing_to_draw_is_refused_before_the_run",
        "test_ratios_are_the_median_of_the_rounds_ratios_with_the_interval_it_lies_in",
        "test_a_figure_is_noisy_when_its_rounds_cannot_pin_the_median_within_15_percent",
        "test_the_whole_report_fits_100_columns_and_every_ratio_is_a_time_ratio",
        "test_a_table_wider_than_the_terminal_is_cut_into_tables_that_repeat_the_first_column",
        "test_bench_help_says_in_one_line_what_it_measures",
        "test_progress_is_a_line_a_section_off_a_terminal_and_a_line_a_step_on_one",
        "test_unknown_section_is_refused",
        "test_n_64mb_is_a_whole_number_of_at_least_one",
        "test_a_run_is_set_beside_the_committed_runs_of_its_processor_alone",
        "test_importing_hostfeed_loads_no_benchmark_code"}),
    # Version strings and settings; not the import under a faked version (the real JAX's
    # import is what it runs).
    "test_lifecycle.py": frozenset({
        "test_start_receiver_validates_the_bound",
        "test_jax_older_than_0_10_is_refused_with_the_upgrade_command",
        "test_every_supported_jax_is_accepted_silently",
        "test_jax_newer_than_tested_warns_once_naming_the_tested_range",
        "test_queue_bound_comes_from_the_environment",
        "test_invalid_queue_bound_environment_is_a_clear_error"}),
    "test_fast_dispatch.py": frozenset({"test_a_bad_setting_is_refused_at_import"}),
    # The driver libraries' loaders (stand-ins built with cc), in Rust.
    "test_cuda_lowering.py": frozenset({
        "test_the_driver_is_loaded_as_libcuda_so_1_with_every_function_hostfeed_calls",
        "test_cuda_pool_stats_answer_without_a_gpu",
        "test_the_copy_floor_benchmark_is_not_in_the_shipped_module"}),
    "test_rocm_lowering.py": frozenset({
        "test_the_runtime_is_found_by_a_versioned_name_with_every_function_hostfeed_calls",
        "test_registrations_name_the_cpu_targets_for_rocm"}),
}

#: Tests whose outcome may depend on the JAX release but not on the transport that
#: HOSTFEED_TRANSPORT forces: they lower no callback, or choose each transport themselves.
#: They run on every JAX release; `pytest --scope=transport` (CI's portable pass) leaves
#: them out, with the host-side ones.
TRANSPORT_AGNOSTIC: dict[str, object] = {
    "test_portable.py": ALL,  # runs each transport itself (transports.forcing)
    "test_bench.py": ALL,  # the bench measures each transport itself (its portable section)
    "test_lifecycle.py": frozenset({"test_importing_under_a_newer_or_older_jax"}),
    "test_cuda_lowering.py": frozenset({
        "test_the_package_imports_without_cuda_libraries_in_a_fresh_process",
        "test_native_transport_forced_refuses_other_platforms_with_a_clear_message",
        "test_other_platforms_take_the_portable_transport_without_refusal"}),
    "test_rocm_lowering.py": frozenset({
        "test_native_transport_forced_lowers_for_rocm_without_a_backend",
        "test_rocm_lowers_natively_by_default_and_jax_when_forced"}),
}

#: The smoke test (`python -m pytest -m smoke`, about a minute: the README's check that an
#: install works before the whole suite): one test of each use, through the public API:
#: taps in order under jit and the loops, id_print, call, a tap function's exception at
#: the barrier, the transformations, the legacy import, recording and reading back,
#: every=/stats, Recorder.step, capture.
SMOKE: dict[str, object] = {
    "test_taps.py": frozenset({"test_jit_tap_values_and_result",
                               "test_scan_taps_every_iteration_in_order",
                               "test_while_loop_body_and_predicate_in_order"}),
    "test_printing.py": frozenset({"test_print_layouts_of_the_legacy_module_examples"}),
    "test_call.py": frozenset({"test_scalar_array_and_pytree_results_eager_and_jit",
                               "test_raising_callback_is_an_error_with_the_exception_text"}),
    "test_errors.py": frozenset({"test_exception_surfaces_at_barrier_and_later_taps_run"}),
    "test_transforms.py": frozenset({"test_docstring_grad", "test_docstring_vmap"}),
    "test_install.py": frozenset({"test_legacy_import_runs_unchanged_after_install"}),
    "test_recording.py": frozenset({"test_jit_rows_are_bit_exact_with_step_device_and_order"}),
    "test_selective.py": frozenset({
        "test_every_start_stop_under_jit_and_scan_record_exactly_the_selected_steps"}),
    "test_recorded_step.py": frozenset({"test_top_level_records_are_outputs_with_the_same_rows"}),
    "test_capture.py": frozenset({
        "test_gradients_are_those_of_the_same_step_with_hand_placed_records"}),
}

_SCOPES = ("all", "jax", "host", "transport")

#: The options that change how tests run (set from the command line by pytest_configure):
#: ``short_soaks``, soak-like tests (races given a number of seconds) run their short
#: variant (see :func:`soak_seconds`).
_RUN = {"short_soaks": False}


def soak_seconds(long: float, short: float) -> float:
    """How many seconds a soak-like test runs: ``long``, or ``short`` with ``--short-soaks``
    (CI's `tests` sessions but the newest JAX's: the same code path on each release, for
    less time; the long variant runs once)."""
    return short if _RUN["short_soaks"] else long


def pytest_addoption(parser):
    parser.addoption("--scope", choices=_SCOPES, default="all",
                     help="which tests run (conftest.HOST_SIDE, TRANSPORT_AGNOSTIC): all; "
                          "jax (those whose result may depend on the JAX release: all but "
                          "HOST_SIDE); host (only HOST_SIDE); transport (those that may also "
                          "depend on the transport: all but HOST_SIDE and TRANSPORT_AGNOSTIC)")
    parser.addoption("--short-soaks", action="store_true",
                     help="soak-like tests run their short variant (conftest.soak_seconds)")


def pytest_configure(config):
    _RUN["short_soaks"] = config.getoption("--short-soaks")
    _check_lists()


def _check_lists() -> None:
    """Every file and test the lists name exists (a renamed test would silently run
    everywhere, or nowhere it should)."""
    here = pathlib.Path(__file__).parent
    for table, entries in (("HOST_SIDE", HOST_SIDE), ("TRANSPORT_AGNOSTIC", TRANSPORT_AGNOSTIC),
                           ("SMOKE", SMOKE)):
        for file, names in entries.items():
            path = here / file
            if not path.is_file():
                raise pytest.UsageError(f"conftest.{table} names {file}, which does not exist")
            if names is ALL:
                continue
            text = path.read_text()
            missing = sorted(n for n in names if f"def {n}(" not in text)
            if missing:
                raise pytest.UsageError(f"conftest.{table} names tests {file} does not "
                                        f"define: {', '.join(missing)}")


def _listed(entries: dict[str, object], item) -> bool:
    names = entries.get(item.path.name)
    return names is ALL or (names is not None and
                            getattr(item, "originalname", item.name) in names)


def _deselect_by_scope(config, items) -> None:
    scope = config.getoption("--scope")
    if scope == "all":
        return
    keep, drop = [], []
    for item in items:
        host_side = _listed(HOST_SIDE, item)
        if scope == "host":
            wanted = host_side
        elif scope == "jax":
            wanted = not host_side
        else:  # transport
            wanted = not host_side and not _listed(TRANSPORT_AGNOSTIC, item)
        (keep if wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_modifyitems(config, items):
    """On a GPU or a TPU, tests marked ``several_devices`` (many CPU devices or processes in
    subprocesses) are skipped: the accelerator machine has one device, and CI runs them on
    CPU. With the portable transport (``HOSTFEED_TRANSPORT=jax``, or a TPU), tests marked
    ``native_transport(reason)`` (about hostfeed's native handlers themselves) are skipped
    with their reason. ``--scope`` deselects tests (:data:`HOST_SIDE`,
    :data:`TRANSPORT_AGNOSTIC`); the tests :data:`SMOKE` names are marked ``smoke``."""
    for item in items:
        if _listed(SMOKE, item):
            item.add_marker(pytest.mark.smoke)
    _deselect_by_scope(config, items)
    if PORTABLE:
        for item in items:
            marker = item.get_closest_marker("native_transport")
            if marker:
                why = marker.args[0] if marker.args else "tests the native transport"
                item.add_marker(pytest.mark.skip(reason=f"native transport only: {why}"))
    if not ON_ACCELERATOR:
        return
    skip = pytest.mark.skip(reason="needs several devices (runs on CPU devices in CI)")
    for item in items:
        if item.get_closest_marker("several_devices"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _one_process_holds_the_tpu(monkeypatch):
    """On a TPU, a test that starts another Python process is skipped when it does: one
    process at a time can hold the chip, and this one does (CI runs these tests on CPU)."""
    if not ON_TPU:
        yield
        return
    real_init = subprocess.Popen.__init__

    def init(self, args, *rest, **kwargs):
        first = args if isinstance(args, (str, bytes)) else args[0]
        name = os.path.basename(os.fsdecode(first).split()[0])
        if first == sys.executable or name.startswith("python"):
            pytest.skip("starts another JAX process, and one process at a time can hold a "
                        "TPU (runs on CPU in CI)")
        real_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", init)
    yield


@pytest.fixture(autouse=True)
def _tap_mode_restored():
    """The process's tap mode (``hcb.set_sync_taps``, and ``HOSTFEED_SYNC_TAPS`` for the
    processes tests start) as it was before the test: a test (or a docstring example) that
    sets it does not change the mode of the tests after it."""
    import jax

    from hostfeed._src.primitives import sync_taps_state

    before, env = sync_taps_state.get_global(), os.environ.get("HOSTFEED_SYNC_TAPS")
    yield
    if sync_taps_state.get_global() != before:
        jax.config.update("hostfeed_sync_taps", before)
    if os.environ.get("HOSTFEED_SYNC_TAPS") != env:  # (what the processes it starts read)
        if env is None:
            os.environ.pop("HOSTFEED_SYNC_TAPS", None)
        else:
            os.environ["HOSTFEED_SYNC_TAPS"] = env


@pytest.fixture
def default_tap_mode():
    """The default tap mode (the legacy module's: synchronous taps on CPUs and GPUs) for
    the test, whatever the suite's (asynchronous: ``HOSTFEED_SYNC_TAPS=0`` above)."""
    import jax

    jax.config.update("hostfeed_sync_taps", "legacy")  # (restored: _tap_mode_restored)
    yield


@pytest.fixture(autouse=True)
def _receiver_clean_after_test():
    from hostfeed._src.record import lifetime as recording

    with recording.open_lock:
        before = set(recording.open_recorders)
    yield
    try:
        # Raises (and so fails the test's teardown) if a callback exception went unreported.
        hcb.barrier_wait("test_teardown", timeout=120)
    finally:
        # A recorder the test opened and left open (an assertion failed before its close)
        # is closed here and fails this test: left open, it would keep writing (and renewing
        # its lease on a store this test's server may no longer serve), and every later
        # test's barrier would report its errors.
        with recording.open_lock:
            left = [rec for rec in recording.open_recorders if rec not in before]
        for rec in left:
            with contextlib.suppress(Exception):
                rec.close()
        if left:
            pytest.fail(f"the test left {len(left)} recorder(s) open: {left!r}")


def _in_mode(name: str):
    before = hcb.get_ad_taps()
    hcb.set_ad_taps(name)
    try:
        yield name
    finally:
        hcb.set_ad_taps(before)


@pytest.fixture(params=["transforms", "primals"])
def mode(request):
    """Runs the test in each autodiff tap mode."""
    yield from _in_mode(request.param)


@pytest.fixture
def transforms_mode():
    """Runs the test in the 'transforms' autodiff tap mode."""
    yield from _in_mode("transforms")


@pytest.fixture
def primals_mode():
    """Runs the test in the 'primals' autodiff tap mode."""
    yield from _in_mode("primals")


@contextlib.contextmanager
def queue_bound(nbytes: int):
    """Runs the block with the receiver's byte bound set to ``nbytes``, then restores it."""
    import hostfeed

    hcb.barrier_wait()
    old = hostfeed.receiver_stats()["max_queue_bytes"]
    hostfeed.start_receiver(max_queue_byte_size=nbytes)
    try:
        yield
    finally:
        hostfeed.start_receiver(max_queue_byte_size=old)


@pytest.fixture
def store(tmp_path):
    """The path of a store not yet made, in the test's own folder."""
    return str(tmp_path / "run.zarr")


#: Dtypes a TPU's host transfers do not carry bit for bit (measured 2026-12-05, TPU v5e,
#: jax 0.10.2): a TPU emulates 64-bit floats (a negative zero arrived as a positive one, and
#: complex128[2, 3, 5] failed to compile), and rewrites the NaN encodings of these float8s;
#: and float16 NaN payloads become the canonical NaN in any TPU computation, JAX's own
#: included (measured 2026-12-06: a jitted identity does it too).
TPU_INEXACT_DTYPES = frozenset({"float64", "complex128", "float8_e3m4", "float8_e4m3",
                                "float16"})


def skip_if_the_tpu_alters(dtype) -> None:
    """Skips a bit-exactness test of ``dtype`` on a TPU that does not carry it bit for bit."""
    import numpy as np

    name = np.dtype(dtype).name
    if ON_TPU and name in TPU_INEXACT_DTYPES:
        pytest.skip(f"a TPU does not carry {name} bit for bit (TPU_INEXACT_DTYPES)")


def skip_gspmd_where_gone(shardy: bool) -> None:
    """Skips a test's GSPMD variant where Shardy always partitions (jax 0.12.1+: the
    ``jax_use_shardy_partitioner`` flag is ignored, so the variant would run Shardy again)."""
    from hostfeed._src import compat

    if not shardy and compat.since("shardy_always"):
        pytest.skip(f"jax {compat.JAX_VERSION}: Shardy always partitions, GSPMD is gone")


def cpu_device_or_skip():
    """JAX's first CPU device; skips the test where JAX has no CPU backend (a TPU machine
    run with ``JAX_PLATFORMS=tpu``): JAX's own ``io_callback`` and ``pure_callback`` place
    their operands on it, and a host function's computations run there."""
    import jax

    try:
        return jax.devices("cpu")[0]
    except RuntimeError:
        pytest.skip("needs JAX's CPU backend beside the accelerator (JAX_PLATFORMS=tpu,cpu)")


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0,
               interval: float = 0.001) -> None:
    """Waits for a condition (polling every ``interval`` seconds), failing after ``timeout``
    seconds."""
    deadline = time.monotonic() + timeout
    event = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        event.wait(interval)


def describe_exit(returncode: int) -> str:
    """How a child process ended, naming the signal that killed it (a crash is reported
    as the failure it is: "killed by SIGSEGV", not a bare -11)."""
    import signal

    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def run_python(code: str, env: dict[str, str] | None = None,
               timeout: float = 180) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (for exit-time and environment behaviour)."""
    full_env = dict(os.environ)
    full_env.setdefault("JAX_PLATFORMS", "cpu")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def calls_on_receiver_thread():
    """Every ``call`` runs on the receiver thread while the test runs (as with
    ``HOSTFEED_CALL_THREAD=receiver``): for what only a host function there can do, be
    abandoned by a stop, or go on after Ctrl-C failed its call."""
    from hostfeed import _receiver

    before = _receiver.host.set_inline_calls(False)
    yield
    _receiver.host.set_inline_calls(before)


def flax_scan_refuses_effects() -> bool:
    """Whether this Flax's ``nn.scan`` refuses any effect in its body (0.12.12, the newest
    for Python 3.12+, does: its check of broadcast variables keeps every effectful
    operation alive and calls their operands a data dependency on the body, for JAX's own
    ``jax.debug.callback`` as for hostfeed's records; 0.12.8 does not)."""
    import jax
    import jax.numpy as jnp
    from flax import linen as nn

    class Body(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            jax.debug.callback(lambda v: None, x)
            return x, None

    class Scanned(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.scan(Body, length=2)()(x, None)[0]

    try:
        Scanned().apply({}, jnp.ones(2))
    except ValueError as exc:
        return "data dependency on the scan body" in str(exc)
    return False
