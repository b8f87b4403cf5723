"""Where every spec field takes effect, and the tests that prove it: a field the code does not
honour is a defect, so every field names both (docs/architecture.md, "Adding a spec field").

docs/api.md renders this as a table.  A unit test fails when a spec field has no row, when a
row names a field the schema does not have, or names a test that does not exist, so the
table cannot fall behind the API.  "Where" names the code that reads the field; the tests
are the ones whose assertions would fail if that code ignored it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Effect:
    where: str
    tests: tuple[str, ...]


def _e(where: str, *tests: str) -> Effect:
    return Effect(where, tests)


UNIT, INTEG, E2E, TORCH = "tests/unit/", "tests/integration/", "tests/e2e/", "tests/torch/"
PODS = UNIT + "operator/test_pods.py::"
MACHINE = UNIT + "operator/test_machine.py::"
IN_PLACE = UNIT + "operator/test_machine_in_place.py::"
INCIDENTS = UNIT + "operator/test_machine_incidents.py::"
TRUTH = UNIT + "operator/test_rollback_truth.py::"
ENGINE = UNIT + "policy/test_policy_engine.py::"
CHECKLIST = UNIT + "preflight/test_checklist.py::"
CONDITION = UNIT + "preflight/test_condition.py::"
DETECTORS = UNIT + "signals/test_signals_detectors.py::"
MONITOR = UNIT + "signals/test_signals_monitor.py::"
DETECTION = UNIT + "contract/test_default_detection.py::"
SETTINGS = TORCH + "checkpoint/test_spec_settings.py::"
GUARD = TORCH + "test_guard_steps.py::"
CRD = INTEG + "test_api_crd.py::"
E2E_ESCALATION = E2E + "test_escalation.py::"
E2E_POISONED_SHARD = E2E + "test_poisoned_shard.py::"
INTEG_CLI_COMMANDS = INTEG + "test_cli_commands.py::"
INTEG_CUSTOM_SIGNAL = INTEG + "test_custom_signal.py::"
INTEG_OPERATOR_LIFECYCLE = INTEG + "test_operator_lifecycle.py::"
INTEG_OPERATOR_LIVE = INTEG + "test_operator_live.py::"
INTEG_OPERATOR_ROLLBACK = INTEG + "test_operator_rollback.py::"
INTEG_PREFLIGHT = INTEG + "test_preflight.py::"
TORCH_GUARD_LR = TORCH + "test_guard_lr.py::"
UNIT_RETENTION = UNIT + "checkpoint/test_retention.py::"
E2E_CHECKPOINT_SETTINGS = E2E + "test_checkpoint_settings.py::"
E2E_NAN_AND_KILLED_RANK = E2E + "test_nan_and_killed_rank.py::"
E2E_ROLLBACK_TRUTH = E2E + "test_restored_steps.py::"
TORCH_SHARDED_BATCHES = TORCH + "test_sharded_batches.py::"
UNIT_CUSTOM_SPARSE = UNIT + "signals/test_custom_sparse.py::"
UNIT_PODS_PLACEMENT = UNIT + "operator/test_pods_placement.py::"
UNIT_STALL_RULE = UNIT + "operator/test_stall_rule.py::"
UNSCHEDULABLE = UNIT + "operator/test_unschedulable_pods.py::"
E2E_UNSCHEDULABLE = (
    E2E + "test_unschedulable.py::"
    "test_without_kueue_unschedulable_pods_say_so_with_the_schedulers_words"
)
SPEC_CHECK = UNIT + "operator/test_spec_check.py::"
HOSTILE = INTEG + "test_hostile_tenant.py::"
ROLLOUT = UNIT + "operator/test_spec_rollout.py::"
EFFECTIVE = UNIT + "platform_policy/test_effective_policy.py::"
INTEG_PLATFORM_POLICY = INTEG + "test_platform_policy.py::"
E2E_LIVE_EDIT = E2E + "test_live_policy_edit.py::"
_FIXED = CRD + "test_a_field_fixed_at_creation_is_refused_naming_the_field_and_why"
_LIVE_SETTINGS = ROLLOUT + "test_checkpoint_settings_reach_the_pods_live"
_MANAGER_LIVE = SETTINGS + "test_an_edited_spec_s_settings_change_the_running_manager"
GROUP = "the fields below"
_POD_CONTRACT = PODS + "test_pod_carries_torchrun_settings_and_the_agent_contract"

FIELD_EFFECTS: dict[str, Effect] = {
    "spec": _e(GROUP, CRD + "test_example_is_accepted_with_the_documented_defaults"),
    "spec.workers": _e(GROUP, _POD_CONTRACT),
    "spec.workers.nodes": _e(
        "pods.torchrun_env (PET_NNODES, STABLETRAIN_NODES); reconcile launches one pod per node; "
        "fixed at creation (CEL transition rule)",
        _POD_CONTRACT,
        _FIXED,
        INTEG_OPERATOR_LIFECYCLE + "test_job_runs_its_torchrun_pods_to_success",
        PODS + "test_non_default_workers_and_rendezvous_settings_reach_torchrun",
    ),
    "spec.workers.processesPerNode": _e(
        "pods.torchrun_env (PET_NPROC_PER_NODE, STABLETRAIN_PROCESSES_PER_NODE); fixed at "
        "creation (CEL transition rule)",
        _POD_CONTRACT,
        _FIXED,
        PODS + "test_non_default_workers_and_rendezvous_settings_reach_torchrun",
    ),
    "spec.workers.template": _e(
        "pods.build_pod: the template is each worker pod, the operator's entries added; "
        "tenancy.spec_check: its shape, the cluster's Pod Security level, a dry run; an edit "
        "reaches the next attempt's pods (status.builtFrom, SpecApplied AtNextAttempt)",
        PODS + "test_user_env_and_template_survive_but_operator_values_win",
        SPEC_CHECK + "test_a_malformed_template_names_its_field_instead_of_raising",
        SPEC_CHECK + "test_pod_security_problems_name_the_template_field_and_the_level",
        HOSTILE + "test_point4_a_spec_that_cannot_become_pods_is_held_once_and_costs_nothing_more",
        ROLLOUT + "test_a_template_edit_waits_for_the_next_attempt_and_says_so",
    ),
    "spec.workers.template.metadata": _e(
        "pods.build_pod: labels and annotations of every worker pod",
        PODS + "test_user_env_and_template_survive_but_operator_values_win",
    ),
    "spec.workers.template.spec": _e(
        "pods.build_pod: the worker pod's spec",
        PODS + "test_user_env_and_template_survive_but_operator_values_win",
    ),
    "spec.workers.template.spec.containers": _e(
        "pods.build_pod: the training container gets torchrun's and the agent's env and mounts",
        PODS + "test_user_env_and_template_survive_but_operator_values_win",
    ),
    "spec.workers.containerName": _e(
        "pods._training_container",
        PODS + "test_unknown_container_name_is_an_error_that_names_the_containers",
    ),
    "spec.workers.rendezvous": _e(GROUP, PODS + "test_rank_zero_hosts_the_rendezvous_store"),
    "spec.workers.rendezvous.backend": _e(
        "pods.torchrun_env (PET_RDZV_BACKEND; c10d also sets is_host)",
        PODS + "test_rank_zero_hosts_the_rendezvous_store",
        PODS + "test_non_default_workers_and_rendezvous_settings_reach_torchrun",
    ),
    "spec.workers.rendezvous.port": _e(
        "pods.torchrun_env (PET_RDZV_ENDPOINT, PET_MASTER_PORT)",
        _POD_CONTRACT,
        PODS + "test_non_default_workers_and_rendezvous_settings_reach_torchrun",
    ),
    "spec.workers.rendezvous.timeoutSeconds": _e(
        "pods.torchrun_env (PET_RDZV_CONF join_timeout)",
        _POD_CONTRACT,
        PODS + "test_non_default_workers_and_rendezvous_settings_reach_torchrun",
    ),
    "spec.checkpoints": _e(GROUP, PODS + "test_pod_carries_the_checkpoint_settings_of_the_spec"),
    "spec.checkpoints.local": _e(GROUP, _POD_CONTRACT),
    "spec.checkpoints.local.hostPath": _e(
        "pods._volumes: the local tier's hostPath volume <hostPath>/<namespace>/<job> "
        "(DirectoryOrCreate); tenancy.local_tier: one of the cluster's node directories; "
        "fixed at creation",
        _POD_CONTRACT,
        _FIXED,
        E2E_CHECKPOINT_SETTINGS + "test_interval_and_retention_of_the_spec_are_what_the_pods_do",
        SPEC_CHECK + "test_a_node_directory_must_be_one_the_cluster_allows",
        HOSTILE + "test_point1_a_job_gets_its_own_node_directory_and_nothing_more",
    ),
    "spec.checkpoints.local.volume": _e(
        "pods._volumes: the local tier's volume source instead of a hostPath; "
        "tenancy.local_tier: one source of a type the cluster allows",
        PODS + "test_a_local_volume_and_a_pfs_sub_path_are_what_the_pod_mounts",
        SPEC_CHECK + "test_a_local_volume_must_be_one_source_of_an_allowed_type",
    ),
    "spec.checkpoints.local.retention": _e(
        "pods.checkpoint_env (STABLETRAIN_LOCAL_RETENTION), then the directives' checkpoints "
        "(live when edited) -> CheckpointConfig.keep_local -> the manager's local retention; "
        "preflight tier space and retention depth",
        PODS + "test_pod_carries_the_checkpoint_settings_of_the_spec",
        _MANAGER_LIVE,
        SETTINGS + "test_interval_and_retention_come_from_the_spec",
        E2E_CHECKPOINT_SETTINGS + "test_interval_and_retention_of_the_spec_are_what_the_pods_do",
    ),
    "spec.checkpoints.local.sizeLimit": _e(
        "pods.checkpoint_env (STABLETRAIN_LOCAL_SIZE_LIMIT_BYTES), then the directives' "
        "checkpoints (live when edited) -> the manager keeps fewer local copies; preflight "
        "local_size_limit, local_retention_capped",
        PODS + "test_pod_carries_the_checkpoint_settings_of_the_spec",
        SETTINGS + "test_the_size_limit_keeps_fewer_local_copies_than_the_retention",
        CHECKLIST + "test_the_local_tier_is_judged_by_what_the_agent_keeps_under_its_size_limit",
    ),
    "spec.checkpoints.pfs": _e(GROUP, _POD_CONTRACT),
    "spec.checkpoints.pfs.claimName": _e(
        "pods._volumes: the PFS tier's PersistentVolumeClaim; fixed at creation",
        _POD_CONTRACT,
        _FIXED,
    ),
    "spec.checkpoints.pfs.subPath": _e(
        "pods._mounts: subPath of the PFS mount; fixed at creation",
        PODS + "test_a_local_volume_and_a_pfs_sub_path_are_what_the_pod_mounts",
        _FIXED,
    ),
    "spec.checkpoints.pfs.retention": _e(
        "pods.checkpoint_env (STABLETRAIN_PFS_RETENTION), then the directives' checkpoints "
        "(live when edited) -> CheckpointConfig.keep_pfs -> the manager's PFS retention; "
        "preflight tier space and retention depth",
        SETTINGS + "test_interval_and_retention_come_from_the_spec",
        _LIVE_SETTINGS,
        CHECKLIST + "test_retention_that_cannot_hold_an_escalated_rollback_warns_per_tier",
        E2E_CHECKPOINT_SETTINGS + "test_interval_and_retention_of_the_spec_are_what_the_pods_do",
    ),
    "spec.checkpoints.memory": _e(GROUP, _POD_CONTRACT),
    "spec.checkpoints.memory.intervalSteps": _e(
        "pods.checkpoint_env (STABLETRAIN_MEMORY_INTERVAL_STEPS; 0: no memory volume) -> "
        "CheckpointManager.is_snapshot_step / snapshot (Guard.step offers every healthy step); "
        "preflight memory-tier-too-large",
        PODS + "test_pod_carries_the_checkpoint_settings_of_the_spec",
        PODS + "test_a_memory_interval_of_0_mounts_no_memory_tier",
        SETTINGS + "test_the_memory_interval_comes_from_the_spec",
        CHECKLIST + "test_the_memory_tier_is_judged_against_the_containers_memory_limit",
        TORCH + "checkpoint/test_memory_killed_rank.py::"
        "test_a_killed_rank_loses_less_than_a_snapshot_interval_when_the_pods_are_kept",
    ),
    "spec.checkpoints.selection": _e(
        "plan.checkpoint.choose_checkpoint (BothTiers: also on every node of the relaunch"
        " that ran the attempt which wrote it)",
        TRUTH + "test_both_tiers_passes_over_a_newer_pfs_only_checkpoint_and_says_what_it_costs",
        TRUTH + "test_both_tiers_takes_the_pfs_copy_only_when_no_candidate_is_on_every_node",
        TRUTH + "test_a_node_that_never_ran_the_attempt_reads_the_newest_from_the_pfs",
        TRUTH + "test_the_planned_event_and_history_say_what_both_tiers_cost",
    ),
    "spec.checkpoints.intervalSteps": _e(
        "pods.checkpoint_env (STABLETRAIN_CHECKPOINT_INTERVAL_STEPS), then the directives' "
        "checkpoints (live when edited) -> CheckpointManager.is_save_step / Guard.is_save_step; "
        "preflight lost-work budget and retention depth",
        SETTINGS + "test_interval_and_retention_come_from_the_spec",
        _LIVE_SETTINGS,
        _MANAGER_LIVE,
        E2E_CHECKPOINT_SETTINGS + "test_interval_and_retention_of_the_spec_are_what_the_pods_do",
        CHECKLIST + "test_checkpoint_interval_against_the_lost_work_budget",
    ),
    "spec.checkpoints.spikeMarkers": _e(
        "pods.checkpoint_env (STABLETRAIN_SPIKE_MARKERS), then the directives' checkpoints "
        "(live when edited) -> the manager writes and keeps the earliest markers of the newest "
        "episode",
        SETTINGS + "test_spike_markers_keep_the_earliest_of_the_newest_episode",
        UNIT_RETENTION + "test_the_earliest_markers_of_an_episode_are_kept",
    ),
    "spec.detection": _e(
        "plan.sent_directives: every attempt's directives and, edited, live directives to the "
        "running pods (plan.rollout) -> the agent's SignalMonitor; a StableTrainingPolicy's "
        "defaults fill what it leaves out",
        PODS + "test_every_attempts_directives_carry_the_specs_detection",
        EFFECTIVE + "test_a_job_that_sets_nothing_inherits_the_policy_and_the_built_in_rest",
        GUARD + "test_a_live_threshold_directive_changes_what_trips_from_the_next_step",
        INTEG_CUSTOM_SIGNAL + "test_validation_loss_jump_alerts_and_replay_alerts_the_same",
    ),
    "spec.detection.baseline": _e(
        GROUP, DETECTORS + "test_anomalous_values_never_enter_the_baseline"
    ),
    "spec.detection.baseline.emaFactor": _e(
        "signals.baseline.Baseline (the EMA the ratio rules compare with)",
        DETECTION + "test_ema_factor_weights_the_newest_value",
        DETECTORS + "test_the_baseline_ema_moves_by_the_configured_factor",
    ),
    "spec.detection.baseline.window": _e(
        "signals.baseline.Baseline (the window of the robust z-score)",
        DETECTORS + "test_robust_zscore_ignores_one_outlier_in_the_window",
    ),
    "spec.detection.baseline.minSamples": _e(
        "signals.spike.SpikeDetector: seeds judged against their median until the EMA is full",
        DETECTORS + "test_a_spike_while_the_baseline_seeds_is_judged_and_not_learned",
        GUARD + "test_a_loss_spike_while_the_baseline_seeds_trips_instead_of_being_learned",
    ),
    "spec.detection.baseline.warmupSteps": _e(
        "signals.spike.SpikeDetector: global steps below it are neither judged nor learned",
        DETECTORS + "test_warmup_steps_are_neither_judged_nor_learned",
    ),
    "spec.detection.lossSpike": _e(
        GROUP, MONITOR + "test_sustained_two_x_spike_trips_with_the_correct_onset"
    ),
    "spec.detection.lossSpike.ratio": _e(
        "signals.spike.SpikeDetector (ratio rule)",
        MONITOR + "test_sustained_two_x_spike_trips_with_the_correct_onset",
        DETECTION + "test_stricter_config_would_miss_the_smallest_logbook_ratio",
    ),
    "spec.detection.lossSpike.zscore": _e(
        "signals.spike.SpikeDetector (robust z-score rule)",
        DETECTORS + "test_zscore_rule_fires_where_the_ratio_rule_would_not",
    ),
    "spec.detection.lossSpike.consecutiveSteps": _e(
        "signals.spike.SpikeDetector (sustained after N steps; only sustained spikes trip)",
        DETECTION + "test_logbook_spike_for_fewer_steps_than_required_does_not_trip",
    ),
    "spec.detection.gradNormSpike": _e(
        GROUP, MONITOR + "test_grad_norm_leading_the_loss_is_divergence_bloom_176b"
    ),
    "spec.detection.gradNormSpike.ratio": _e(
        "signals.spike.SpikeDetector on the pre-clip grad norm",
        ENGINE + "test_default_policy_only_alerts_on_grad_norm_spikes",
        MONITOR + "test_grad_norm_leading_the_loss_is_divergence_bloom_176b",
    ),
    "spec.detection.gradNormSpike.zscore": _e(
        "signals.spike.SpikeDetector on the pre-clip grad norm (robust z-score rule)",
        DETECTORS + "test_zscore_rule_fires_where_the_ratio_rule_would_not",
    ),
    "spec.detection.gradNormSpike.consecutiveSteps": _e(
        "signals.spike.SpikeDetector on the pre-clip grad norm",
        MONITOR + "test_recurring_grad_norm_spikes_point_at_the_lr",
    ),
    "spec.detection.nonFinite": _e(
        GROUP, MONITOR + "test_nan_skips_the_update_and_trips_when_sustained"
    ),
    "spec.detection.nonFinite.consecutiveSteps": _e(
        "signals.non_finite.NonFiniteValues (NaN/Inf streak); the update is always skipped",
        MONITOR + "test_nan_skips_the_update_and_trips_when_sustained",
        GUARD + "test_a_live_threshold_directive_changes_what_trips_from_the_next_step",
    ),
    "spec.detection.throughput": _e(
        GROUP,
        MONITOR
        + "test_throughput_dips_after_restart_and_during_save_are_excused_a_real_drop_is_not",
    ),
    "spec.detection.throughput.dropFraction": _e(
        "signals.throughput.ThroughputDetector",
        DETECTION + "test_throughput_drop_respects_grace_after_restart_or_save",
    ),
    "spec.detection.throughput.graceSteps": _e(
        "signals.throughput.ThroughputDetector (no judgement after a restart or a save)",
        DETECTORS + "test_throughput_grace_follows_restart_and_save_then_a_real_drop_counts",
    ),
    "spec.detection.throughput.consecutiveSteps": _e(
        "signals.throughput.ThroughputDetector",
        MONITOR
        + "test_throughput_dips_after_restart_and_during_save_are_excused_a_real_drop_is_not",
    ),
    "spec.detection.stallSeconds": _e(
        "policy.incident.gather_observations -> observe.stall.judge_stall (Stalled from the "
        "agents' heartbeats)",
        UNIT_STALL_RULE + "test_no_step_for_the_bound_stalls_and_names_the_rank_outside_torch",
        INCIDENTS
        + "test_a_stall_restarts_and_the_relaunch_keeps_away_from_the_node_that_stopped_first",
    ),
    "spec.detection.custom": _e(
        "the agent's CustomDetector per entry (Guard.observe feeds it)",
        INTEG_CUSTOM_SIGNAL + "test_validation_loss_jump_alerts_and_replay_alerts_the_same",
    ),
    "spec.detection.custom[].name": _e(
        "the signal custom:<name> that rules match and the agent trips on",
        MONITOR + "test_custom_signal_trips_when_named_in_trip_on",
    ),
    "spec.detection.custom[].metric": _e(
        "signals.custom.CustomDetector: the name given to Guard.observe",
        INTEG_CUSTOM_SIGNAL + "test_validation_loss_jump_alerts_and_replay_alerts_the_same",
    ),
    "spec.detection.custom[].kind": _e(
        "signals.custom.CustomDetector (above, below or a relative jump)",
        DETECTION + "test_custom_signal_threshold_kinds",
    ),
    "spec.detection.custom[].threshold": _e(
        "signals.custom.CustomDetector", DETECTION + "test_custom_signal_threshold_kinds"
    ),
    "spec.detection.custom[].consecutiveSteps": _e(
        "signals.custom.CustomDetector",
        UNIT_CUSTOM_SPARSE + "test_a_sparse_series_fires_between_its_reports_until_a_healthy_one",
    ),
    "spec.detection.custom[].anomalyClass": _e(
        "the finding's class, matched by rules' onClasses",
        INTEG_CUSTOM_SIGNAL
        + "test_entropy_low_while_reward_rises_rolls_back_with_a_lower_lr_as_replay_does",
    ),
    "spec.recovery": _e(
        "the fields below; a StableTrainingPolicy's defaults fill what it leaves out, its limits "
        "refuse what it sets beyond them (platform_policy.effective)",
        ENGINE + "test_first_matching_rule_wins_in_order",
        INTEG_PLATFORM_POLICY
        + "test_namespace_defaults_are_inherited_overrides_within_limits_kept_beyond_refused",
    ),
    "spec.recovery.rules": _e(
        "policy.engine.decide: first matching rule wins; the directives' trip list and trip "
        "rules (the agent stops where the first match stops the run), live when edited",
        ENGINE + "test_first_matching_rule_wins_in_order",
        ROLLOUT
        + "test_an_edit_of_what_trips_is_sent_live_and_is_in_force_once_every_pod_applied_it",
        E2E_LIVE_EDIT + "test_a_rule_edited_to_alert_before_the_spike_alerts_once_and_never_stops",
        ENGINE + "test_trip_signals_are_what_stopping_rules_name_and_the_agent_computes",
    ),
    "spec.recovery.rules[].name": _e(
        "decisions, Events and rollbackHistory name the rule",
        ENGINE + "test_first_matching_rule_wins_in_order",
    ),
    "spec.recovery.rules[].onSignals": _e(
        "policy.matching", ENGINE + "test_first_matching_rule_wins_in_order"
    ),
    "spec.recovery.rules[].onClasses": _e(
        "policy.matching", ENGINE + "test_on_classes_restricts_the_match"
    ),
    "spec.recovery.rules[].whileFiring": _e(
        "policy.matching", ENGINE + "test_compound_condition_needs_every_while_firing_signal"
    ),
    "spec.recovery.rules[].action": _e(
        "policy.actions: the action registry entry the decision runs",
        ENGINE + "test_a_fail_rule_fails_by_policy",
        MACHINE + "test_reduce_lr_sends_live_directives_without_restart",
    ),
    "spec.recovery.rules[].rollback": _e(
        GROUP,
        ENGINE
        + "test_default_policy_rolls_back_a_sustained_loss_spike_with_the_documented_numbers",
    ),
    "spec.recovery.rules[].rollback.lrFactor": _e(
        "policy.actions (LR scale) -> directives lrScale -> the agent's LrScale",
        ENGINE + "test_lr_scale_is_cumulative_and_floored",
        E2E_NAN_AND_KILLED_RANK + "test_sustained_nan_rolls_back_and_no_update_reaches_the_weights",
    ),
    "spec.recovery.rules[].rollback.lrFloor": _e(
        "policy.actions (the scale never drops below it)",
        ENGINE + "test_lr_scale_is_cumulative_and_floored",
    ),
    "spec.recovery.rules[].rollback.minStepsBeforeOnset": _e(
        "policy.arithmetic (rollback bound) -> plan.checkpoint; preflight lost-work budget",
        ENGINE
        + "test_default_policy_rolls_back_a_sustained_loss_spike_with_the_documented_numbers",
        E2E_ESCALATION + "test_a_recurring_spike_is_rolled_back_harder",
    ),
    "spec.recovery.rules[].rollback.skipStepsBeforeOnset": _e(
        "policy.arithmetic (skip range) -> directives skip -> data.ShardedBatches",
        ENGINE
        + "test_default_policy_rolls_back_a_sustained_loss_spike_with_the_documented_numbers",
        E2E_ESCALATION + "test_a_recurring_spike_is_rolled_back_harder",
    ),
    "spec.recovery.rules[].rollback.skipStepsAfterOnset": _e(
        "policy.arithmetic (skip range) -> directives skip -> data.ShardedBatches",
        ENGINE
        + "test_default_policy_rolls_back_a_sustained_loss_spike_with_the_documented_numbers",
        E2E_ESCALATION + "test_a_recurring_spike_is_rolled_back_harder",
    ),
    "spec.recovery.rules[].rollback.skipData": _e(
        "policy.arithmetic: the trip report's suspect shards in the skip window, or the whole"
        " window -> directives skip -> data.ShardedBatches (the suspect shards' samples passed"
        " over stay out of every later pass)",
        ENGINE + "test_default_rollback_skips_only_the_suspect_shards_in_the_window",
        "tests/torch/test_skip_aware_loader.py::"
        "test_a_suspect_shard_passed_over_stays_unread_in_later_epochs_and_after_a_restore",
        ENGINE + "test_the_whole_window_is_skipped_without_lineage_or_when_the_policy_asks",
        E2E_POISONED_SHARD + "test_poisoned_shard_heals_with_the_default_policy",
        E2E_ESCALATION + "test_a_recurring_spike_is_rolled_back_harder",
    ),
    "spec.recovery.rules[].rollback.rewarmupSteps": _e(
        "directives rewarmupSteps -> the agent's LR ramp after the resume",
        TORCH_GUARD_LR + "test_rewarmup_ramps_the_scaled_lr_after_a_resume",
        E2E_ESCALATION + "test_a_recurring_spike_is_rolled_back_harder",
    ),
    "spec.recovery.rules[].rollback.noCheckpointFarEnough": _e(
        "plan.checkpoint: NarrowMargin, FromScratch or Fail when nothing precedes the bound",
        TRUTH + "test_no_checkpoint_far_enough_narrows_the_margin_to_a_step_before_the_onset",
        TRUTH + "test_no_checkpoint_far_enough_from_scratch_or_fail_as_the_rule_says",
        E2E_ROLLBACK_TRUTH + "test_early_spike_resumes_before_the_onset_with_the_margin_it_used",
    ),
    "spec.recovery.rules[].reduceLR": _e(
        GROUP, ENGINE + "test_reduce_lr_lowers_the_scale_live_then_alerts_at_the_floor"
    ),
    "spec.recovery.rules[].reduceLR.lrFactor": _e(
        "policy.actions -> live directives PUT to the running pods",
        ENGINE + "test_reduce_lr_lowers_the_scale_live_then_alerts_at_the_floor",
        INTEG_OPERATOR_LIVE + "test_reduce_lr_rule_lowers_the_lr_live_without_a_restart",
    ),
    "spec.recovery.rules[].reduceLR.lrFloor": _e(
        "policy.actions (at the floor the rule alerts instead)",
        ENGINE + "test_reduce_lr_lowers_the_scale_live_then_alerts_at_the_floor",
    ),
    "spec.recovery.budgets": _e(
        GROUP, ENGINE + "test_budgets_are_separate_and_a_spent_one_fails_with_its_reason"
    ),
    "spec.recovery.budgets.maxRollbacks": _e(
        "policy.actions (RollbackBudgetExhausted); operator budget gauge",
        ENGINE + "test_budgets_are_separate_and_a_spent_one_fails_with_its_reason",
        INTEG_OPERATOR_ROLLBACK + "test_spent_rollback_budget_fails_the_job_with_the_reason",
    ),
    "spec.recovery.budgets.maxRestarts": _e(
        "policy.actions (RestartBudgetExhausted); operator budget gauge",
        ENGINE + "test_budgets_are_separate_and_a_spent_one_fails_with_its_reason",
    ),
    "spec.recovery.budgets.cooldownSeconds": _e(
        "policy.engine (live actions of a rule; scraped signals after a stop)",
        ENGINE + "test_scraped_stopping_decision_inside_the_cooldown_is_deferred",
        ENGINE + "test_live_actions_of_a_rule_respect_its_cooldown_across_episodes",
    ),
    "spec.recovery.escalation": _e(
        GROUP,
        ENGINE + "test_escalation_widens_the_skip_and_lowers_the_lr_then_takes_the_final_action",
    ),
    "spec.recovery.escalation.withinSteps": _e(
        "policy.ledger (a new onset this close to an earlier one is a recurrence)",
        ENGINE + "test_escalation_widens_the_skip_and_lowers_the_lr_then_takes_the_final_action",
    ),
    "spec.recovery.escalation.maxRecurrences": _e(
        "policy.actions (harder rollbacks before the final action)",
        ENGINE + "test_escalation_widens_the_skip_and_lowers_the_lr_then_takes_the_final_action",
        E2E_ESCALATION + "test_a_recurring_spike_is_rolled_back_harder",
    ),
    "spec.recovery.escalation.finalAction": _e(
        "policy.actions",
        ENGINE + "test_final_action_alert_restarts_a_tripped_run_and_alerts_a_scraped_one",
    ),
    "spec.recovery.restart": _e(
        "pods (the command under the supervisor), machine (Stopping/Relaunching in place)",
        PODS + "test_in_place_runs_the_command_under_the_supervisor_behind_the_agent_port",
        IN_PLACE + "test_a_restart_keeps_the_supervised_pods_and_starts_the_next_attempt_in_them",
        IN_PLACE + "test_recreate_pods_deletes_every_pod_as_before",
        E2E_NAN_AND_KILLED_RANK + "test_a_killed_rank_restarts_in_place_from_the_latest_checkpoint",
    ),
    "spec.recovery.warmStart": _e(
        "pods (STABLETRAIN_WARM_START for the supervisor, the pod shape); preflight "
        "warm-standby-too-large",
        PODS + "test_in_place_runs_the_command_under_the_supervisor_behind_the_agent_port",
        TORCH + "test_warm_start.py::test_a_torchrun_attempt_is_handed_to_warm_standbys",
        CHECKLIST + "test_the_warm_standbys_are_judged_against_the_containers_memory_limit",
    ),
    "spec.recovery.confirmTimeoutSeconds": _e(
        "plan.confirm: Confirming ends unconfirmed (ConfirmationTimedOut) once it runs out",
        MACHINE + "test_confirming_times_out_into_running_unconfirmed",
    ),
    "spec.recovery.placement": _e(
        GROUP, INCIDENTS + "test_placement_ignore_records_suspects_but_launches_anywhere"
    ),
    "spec.recovery.placement.suspects": _e(
        "plan.placement -> pods (node anti-affinity of the relaunch)",
        INCIDENTS + "test_placement_ignore_records_suspects_but_launches_anywhere",
        UNIT_PODS_PLACEMENT
        + "test_required_avoidance_never_lands_on_a_suspect_even_when_it_was_the_previous_node",
    ),
    "spec.recovery.placement.suspectSeconds": _e(
        "plan.placement (a suspect node expires)",
        INCIDENTS + "test_a_second_incident_on_the_node_counts_and_the_list_expires",
    ),
    "spec.recovery.crashLoop": _e(
        GROUP,
        INCIDENTS
        + "test_every_rank_failing_before_its_first_step_ends_the_job_with_the_error_named",
    ),
    "spec.recovery.crashLoop.action": _e(
        "policy.crashloop",
        INCIDENTS
        + "test_every_rank_failing_before_its_first_step_ends_the_job_with_the_error_named",
    ),
    "spec.recovery.crashLoop.backoffSeconds": _e(
        "policy.crashloop, machine (wait before a restart)",
        INCIDENTS + "test_one_failure_after_progress_is_a_plain_restart_and_a_repeat_is_a_loop",
    ),
    "spec.suspend": _e(
        "machine: a live saveRequest, the guard's final checkpoint, then the pods stop; false"
        " relaunches from the newest checkpoint (that one); a rollback being confirmed is given up",
        MACHINE + "test_suspend_saves_first_then_stops_and_resume_relaunches_from_that_save",
        MACHINE + "test_suspend_while_a_rollback_is_confirmed_saves_and_stops_at_once",
        MACHINE + "test_suspend_stops_the_pods_after_its_bound_without_an_answer",
        TORCH
        + "test_guard_save_request.py::test_a_save_request_is_saved_flushed_and_reported_once",
        E2E + "test_suspend.py::test_suspend_saves_a_final_checkpoint_and_resume_restores_it",
        INTEG_OPERATOR_LIFECYCLE
        + "test_suspend_stops_the_pods_and_resume_relaunches_from_the_newest_checkpoint",
    ),
    "spec.scheduling": _e(
        GROUP,
        UNSCHEDULABLE + "test_wait_says_which_pods_and_why_after_the_bound_and_clears_when_placed",
    ),
    "spec.scheduling.unschedulableSeconds": _e(
        "scheduling.stuck_pods (the bound, from each pod's creation); machine._retry_later",
        UNSCHEDULABLE + "test_wait_says_which_pods_and_why_after_the_bound_and_clears_when_placed",
        UNSCHEDULABLE + "test_release_stops_the_attempt_and_tries_again_after_the_bound",
        E2E_UNSCHEDULABLE,
    ),
    "spec.scheduling.whenUnschedulable": _e(
        "machine._unschedulable: Wait keeps the pods; Release stops them (phase Suspended) and"
        " machine._suspended tries again after the bound",
        UNSCHEDULABLE + "test_wait_says_which_pods_and_why_after_the_bound_and_clears_when_placed",
        UNSCHEDULABLE + "test_release_stops_the_attempt_and_tries_again_after_the_bound",
    ),
    "spec.manualRollback": _e(
        "policy.engine: a manual request, once per requestId",
        MACHINE + "test_manual_rollback_runs_once_per_request_id",
        INTEG_CLI_COMMANDS + "test_rollback_runs_once_per_request_id",
    ),
    "spec.manualRollback.requestId": _e(
        "policy.engine (runs once; status.lastManualRequestId)",
        ENGINE + "test_manual_request_rolls_back_once_per_request_id",
    ),
    "spec.manualRollback.toStep": _e(
        "plan.checkpoint (newest stable checkpoint at or before it)",
        ENGINE + "test_manual_request_rolls_back_once_per_request_id",
        MACHINE + "test_manual_rollback_runs_once_per_request_id",
    ),
    "spec.manualRollback.lrFactor": _e(
        "policy.actions (LR scale; null keeps it)",
        ENGINE + "test_manual_request_without_lr_factor_keeps_the_lr_and_ignores_the_budget",
    ),
    "spec.manualRollback.skip": _e(
        "policy.actions -> directives skip",
        ENGINE + "test_manual_request_rolls_back_once_per_request_id",
    ),
    "spec.manualRollback.skip[].first": _e(
        "directives skip -> data.ShardedBatches",
        TORCH_SHARDED_BATCHES
        + "test_step_ranges_of_the_directives_become_the_batches_those_steps_consumed",
    ),
    "spec.manualRollback.skip[].last": _e(
        "directives skip -> data.ShardedBatches",
        TORCH_SHARDED_BATCHES
        + "test_step_ranges_of_the_directives_become_the_batches_those_steps_consumed",
    ),
    "spec.manualRollback.skip[].unit": _e(
        "data.ShardedBatches (steps or samples)",
        TORCH_SHARDED_BATCHES
        + "test_step_ranges_of_the_directives_become_the_batches_those_steps_consumed",
    ),
    "spec.manualRollback.skip[].shardIds": _e(
        "data.ShardedBatches (the range only in these shards; what it passed over of them in"
        " every later pass too)",
        TORCH_SHARDED_BATCHES
        + "test_a_range_limited_to_some_shards_skips_their_samples_there_and_in_every_later_pass",
    ),
    "spec.manualRollback.reason": _e(
        "rollbackHistory and the Event",
        ENGINE + "test_manual_request_rolls_back_once_per_request_id",
    ),
    "spec.preflight": _e(
        GROUP,
        CONDITION + "test_warn_mode_sets_the_condition_from_the_running_pods_and_posts_one_event",
    ),
    "spec.preflight.mode": _e(
        "preflight.condition, machine (Refuse: a preflight pod before any worker)",
        CONDITION + "test_refuse_mode_creates_no_worker_pod_until_the_preflight_passes",
        INTEG_PREFLIGHT + "test_refuse_mode_starts_no_worker_pod_until_a_fixed_spec_passes",
    ),
    "spec.preflight.maxLostSteps": _e(
        "preflight.checklist.interval_over_budget",
        CHECKLIST + "test_checkpoint_interval_against_the_lost_work_budget",
    ),
}


POLICY_FIELD_EFFECTS: dict[str, Effect] = {
    "spec": _e(
        GROUP,
        INTEG_PLATFORM_POLICY
        + "test_namespace_defaults_are_inherited_overrides_within_limits_kept_beyond_refused",
    ),
    "spec.namespaceSelector": _e(
        "platform_policy.selection.selects: the namespaces whose jobs it applies to",
        EFFECTIVE + "test_namespace_selectors_as_kubernetes_evaluates_them",
        INTEG_PLATFORM_POLICY
        + "test_namespace_defaults_are_inherited_overrides_within_limits_kept_beyond_refused",
    ),
    "spec.namespaceSelector.matchLabels": _e(
        "platform_policy.selection.selects",
        EFFECTIVE + "test_namespace_selectors_as_kubernetes_evaluates_them",
    ),
    "spec.namespaceSelector.matchExpressions": _e(
        "platform_policy.selection.selects",
        EFFECTIVE + "test_namespace_selectors_as_kubernetes_evaluates_them",
    ),
    "spec.namespaceSelector.matchExpressions[].key": _e(
        "platform_policy.selection.selects",
        EFFECTIVE + "test_namespace_selectors_as_kubernetes_evaluates_them",
    ),
    "spec.namespaceSelector.matchExpressions[].operator": _e(
        "platform_policy.selection.selects",
        EFFECTIVE + "test_namespace_selectors_as_kubernetes_evaluates_them",
    ),
    "spec.namespaceSelector.matchExpressions[].values": _e(
        "platform_policy.selection.selects",
        EFFECTIVE + "test_namespace_selectors_as_kubernetes_evaluates_them",
    ),
    "spec.priority": _e(
        "platform_policy.selection.applicable (order), platform_policy.effective (first sets wins)",
        EFFECTIVE + "test_the_highest_priority_policy_gives_each_default_and_every_limit_applies",
    ),
    "spec.defaults": _e(
        "platform_policy.effective: what a job that leaves a field out inherits",
        EFFECTIVE + "test_a_job_that_sets_nothing_inherits_the_policy_and_the_built_in_rest",
        INTEG_PLATFORM_POLICY
        + "test_namespace_defaults_are_inherited_overrides_within_limits_kept_beyond_refused",
    ),
    "spec.defaults.detection": _e(
        "platform_policy.effective: merged field by field under the job's spec.detection",
        EFFECTIVE + "test_a_job_that_sets_nothing_inherits_the_policy_and_the_built_in_rest",
        EFFECTIVE + "test_an_effective_policy_that_does_not_validate_is_refused_with_the_field",
    ),
    "spec.defaults.recovery": _e(
        "platform_policy.effective: merged field by field under the job's spec.recovery",
        EFFECTIVE + "test_a_job_that_sets_nothing_inherits_the_policy_and_the_built_in_rest",
        EFFECTIVE + "test_the_highest_priority_policy_gives_each_default_and_every_limit_applies",
    ),
    "spec.limits": _e(
        GROUP, EFFECTIVE + "test_a_value_the_job_sets_beyond_a_limit_is_refused_naming_the_limit"
    ),
    "spec.limits.maxRollbacks": _e(
        "platform_policy.effective: recovery.budgets.maxRollbacks",
        EFFECTIVE + "test_a_value_the_job_sets_beyond_a_limit_is_refused_naming_the_limit",
        ROLLOUT + "test_an_edit_beyond_a_policy_limit_is_not_taken_into_force",
        INTEG_PLATFORM_POLICY
        + "test_namespace_defaults_are_inherited_overrides_within_limits_kept_beyond_refused",
    ),
    "spec.limits.maxRestarts": _e(
        "platform_policy.effective: recovery.budgets.maxRestarts",
        EFFECTIVE + "test_the_highest_priority_policy_gives_each_default_and_every_limit_applies",
    ),
    "spec.limits.minLrFloor": _e(
        "platform_policy.effective: every Rollback and ReduceLR rule's lrFloor",
        EFFECTIVE + "test_a_value_the_job_sets_beyond_a_limit_is_refused_naming_the_limit",
        EFFECTIVE + "test_a_job_that_sets_nothing_inherits_the_policy_and_the_built_in_rest",
    ),
    "spec.limits.minSpikeRatio": _e(
        "platform_policy.effective: detection.lossSpike.ratio, gradNormSpike.ratio",
        EFFECTIVE + "test_a_value_the_job_sets_beyond_a_limit_is_refused_naming_the_limit",
    ),
    "spec.limits.minSpikeZscore": _e(
        "platform_policy.effective: detection.lossSpike.zscore, gradNormSpike.zscore",
        EFFECTIVE + "test_a_value_the_job_sets_beyond_a_limit_is_refused_naming_the_limit",
    ),
    "spec.limits.allowedActions": _e(
        "platform_policy.effective: the rules' actions and escalation.finalAction",
        EFFECTIVE + "test_actions_a_policy_does_not_allow_are_refused_wherever_the_rules_come_from",
    ),
}
"""The same for StableTrainingPolicy; its defaults' nested fields are those of the job's."""
