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
# Several URLs are fine (OpenRLHF splits a batch over them); an empty batch is answered with
# 200 and every key as an empty list (older OpenRLHF sent them to the extra URLs).
# With API keys on, put the key in the path (OpenRLHF cannot send a header):
#   --reward.remote_url http://127.0.0.1:8000/keys/$RMGATE_KEY/get_reward
# Labels may be any JSON (the dataset's label field as is); queries are scored as sent (no
# special tokens added) and truncated to the RM's context (gateway.get_reward_truncation_side).
