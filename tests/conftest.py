"""The suite's markers, from where a test lives, and the fixtures every folder shares.

Each test gets the marker of its top folder: `unit` (tests/unit, cores without
services, no subprocess mesh), `integration` (tests/integration: real services on
loopback ports), `e2e` (tests/e2e: a whole `radixmesh serve`), `kernels`
(tests/kernels: Triton kernels against their references), `chaos` (tests/chaos:
parts of a running mesh killed under load). The unit tests that take seconds each
(listed in SLOW_TESTS, measured with `--durations`) also get `slow`. So

    python -m pytest -q -m "unit and not slow"     # the fast loop
    python -m pytest -q -m unit                    # every unit test
    python -m pytest -q                            # the whole suite (CI)

The markers are registered in pyproject.toml; CONTRIBUTING.md says which to run when.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.redis import redis_server, redis_server_factory  # noqa: F401

TESTS = Path(__file__).parent
FOLDER_MARKERS = ("unit", "integration", "e2e", "kernels", "chaos")
"""Top folders under tests/ that hold tests; each is also the marker of its tests."""

SLOW_TESTS = (
    # hypothesis: a state machine, property tests over many examples
    "unit/cache/test_cache_invariants.py::TestCacheInvariants",
    "unit/executor/test_convert.py::test_sampling_round_trip",
    "unit/executor/test_convert.py::test_constraint_round_trip",
    "unit/executor/test_convert.py::test_plan_round_trip",
    "unit/executor/test_convert.py::test_result_round_trip",
    "unit/gateway/test_gateway_stop.py::test_any_chunking_matches_the_whole_text_reference",
    "unit/executor/test_grammar_matcher.py::test_sampled_json_always_validates_against_its_schema",
    # subprocesses: a whole service started and signalled
    "unit/gateway/test_gateway_main.py::test_gateway_process_serves_and_stops_on_sigterm",
    "unit/common/test_runtime_signal.py::test_signal_stops_gracefully_after_in_flight_calls",
    "unit/supervisor/test_restarts.py::test_a_killed_child_comes_back_on_its_port_with_its_log_kept",
    "unit/supervisor/test_restarts.py::test_kill_all_stops_every_child_at_once",
    "unit/supervisor/test_supervisor.py::test_stages_start_in_order_and_stop_in_reverse",
    "unit/supervisor/test_supervisor.py::test_wait_any_exit_reports_the_child_that_died",
    "unit/supervisor/test_supervisor.py::test_a_child_that_ignores_sigterm_is_killed",
    "unit/executor/test_generate_cli.py::test_generate_json_equals_transformers_greedy",
    "unit/loadgen/test_bench_command.py::test_shared_prefix_run_reports_every_field_and_a_high_hit_rate",
    "unit/common/test_runtime_lifecycle.py::test_shutdown_refuses_new_calls_and_cancels_streams_past_grace",
    "unit/common/test_profiling.py::test_torch_profile_covers_the_requested_steps_of_another_thread",
    "unit/common/test_profiling.py::test_torch_profile_of_an_idle_service_says_so",
    "unit/executor/test_tensor_parallel.py::test_tp2_greedy_tokens_and_logits_equal_tp1",
    "unit/executor/test_tensor_parallel.py::test_tp2_with_one_kv_head_replicated_and_a_vocabulary_padded",
    "unit/executor/test_tensor_parallel.py::test_tp2_fp8_projections_equal_tp1_fp8",
    "unit/test_kubernetes.py::test_validates_against_the_kubernetes_schemas",
    # many forward passes of the tiny models, against transformers or each other
    "unit/executor/test_overlap.py::test_prepare_ahead_of_execute_equals_sequential_steps",
    "unit/executor/test_model_fidelity.py::test_batched_greedy_equals_each_prompt_alone",
    "unit/executor/test_model_fidelity.py::test_greedy_continuation_matches_transformers_generate",
    "unit/executor/test_model_fidelity.py::test_repetition_penalty_sees_prompt_and_outputs_like_transformers",
    "unit/executor/test_sliding_window.py::test_prefill_extend_and_decode_logits_match_transformers",
    "unit/executor/test_sliding_window.py::test_greedy_past_the_window_matches_transformers_generate",
    "unit/executor/test_dense_prefill_path.py::test_prefill_extend_and_decode_through_the_dense_kernel_match_transformers",
    "unit/executor/test_batching.py::test_extends_over_shared_prefix_pages_mixed_with_prefill_and_decode",
    "unit/executor/test_grammar_engine.py::test_unconstrained_rows_stay_unmasked_when_a_constrained_rows_buffer_is_reused",
    "unit/executor/test_grammar_engine.py::test_min_tokens_still_holds_eos_back_where_the_grammar_allows_more",
    "unit/executor/test_grammar_engine.py::test_a_finished_grammar_ends_the_sequence_despite_min_tokens",
    "unit/executor/test_grammar_engine.py::test_on_cpu_the_bitmask_is_filled_while_the_forward_runs",
    "unit/executor/test_overlap.py::test_a_token_the_grammar_refuses_aborts_only_that_sequence",
    "unit/executor/test_executor.py::test_the_prefill_warm_up_leaves_nothing_a_request_reads",
    "unit/executor/test_executor.py::test_finished_ids_drop_first_so_a_preempted_sequence_can_resume",
    "unit/executor/test_prompt_scoring.py::test_prompt_logprobs_of_a_whole_prefill_equal_a_full_forward",
    "unit/executor/test_prompt_scoring.py::test_a_batch_of_scoring_requests_runs_in_one_forward",
    "unit/executor/test_prompt_scoring.py::test_prompt_logprobs_over_a_cached_prefix_and_across_chunks",
    "unit/executor/test_fp8.py::test_quantization_fp8_quantizes_a_full_precision_checkpoint_per_row",
    "unit/executor/test_loader.py::test_sharded_checkpoint_loads_the_same_model",
    "unit/executor/test_jump_forward.py::test_greedy_outputs_are_identical_and_each_forced_token_saves_a_forward",
    "unit/executor/test_jump_forward.py::test_seeded_sampling_is_identical",
    "unit/executor/test_jump_forward.py::test_one_sequence_saves_exactly_one_forward_per_forced_token",
    "unit/executor/test_speculative.py::test_greedy_outputs_are_token_identical_with_speculation",
    "unit/executor/test_speculative.py::test_seeded_sampling_is_identical_with_speculation",
    "unit/executor/test_speculative.py::test_sampled_outputs_follow_the_target_distribution",
    "unit/engine/test_schema_corpus.py::test_every_stop_output_validates_and_every_refusal_names_a_keyword",
    "unit/engine/test_schema_corpus.py::test_the_escape_number_bound_and_format_defects_hold_over_many_seeds",
    # sampling statistics over many draws
    "unit/executor/test_sampling.py::test_uniforms_are_uniform_over_a_large_vocab",
    "unit/executor/test_sampling.py::test_empirical_distribution_matches_filtered_softmax",
)
"""Unit tests that take about a second or more each on the shared 2-core build machines
(`--durations`; "path::name", relative to tests/, every parametrization included).
tests/unit/test_markers.py checks that each one still names a test."""


def _is_slow(nodeid: str) -> bool:
    name = nodeid.removeprefix("tests/")
    return any(name == slow or name.startswith((f"{slow}[", f"{slow}::")) for slow in SLOW_TESTS)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            folder = item.path.relative_to(TESTS).parts[0]
        except ValueError:
            continue  # collected from outside tests/
        if folder in FOLDER_MARKERS:
            item.add_marker(getattr(pytest.mark, folder))
        if _is_slow(item.nodeid):
            item.add_marker(pytest.mark.slow)
