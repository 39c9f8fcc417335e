#!/usr/bin/env bash
# OpenRLHF: use rmgate as the remote reward model. Start the gateway first
# (`rmgate serve configs/demo-cpu.yaml`); /get_reward scores with the config's
# `gateway.default_reward_model`.
# OpenRLHF >= 0.10:
python -m openrlhf.cli.train_ppo_ray \
  --pretrain "$POLICY_MODEL" \
  --reward.remote_url http://127.0.0.1:8000/get_reward \
  "$@"
# Older OpenRLHF: --remote_rm_url http://127.0.0.1:8000/get_reward
# Several URLs are fine: OpenRLHF sends empty batches to the extra ones, which rmgate
# answers with 200 and empty lists.
