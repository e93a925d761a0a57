# GRPO with verl 0.9.1, rollouts on bubblespec.
#
# This is verl's stock GRPO example `examples/grpo_trainer/run_qwen2-7b.sh` (Qwen2-7B-Instruct
# on GSM8K, verl 0.9.1) with only the lines marked "bubblespec" changed or added:
#
#   rollout.name=bubblespec                      the backend (registered by `pip install
#                                                bubblespec[verl]` through verl's plugins)
#   rollout.agent.agent_loop_manager_class=...   the next-batch hook (verl's own setting)
#   rollout.tensor_model_parallel_size=1         bubblespec ranks run one device each (its
#                                                engine has no tensor-parallel setting yet)
#   trainer.use_v1=False                         the hook extends the synchronous trainer's
#                                                AgentLoopManager (verl 0.9's default v1
#                                                trainer feeds rollouts through TransferQueue)
#   rollout.engine_kwargs.bubblespec.ranks=8     the ranks run on devices of their own (8
#                                                GPUs besides the trainer's 8: a Ray cluster
#                                                of 16), not on the trainer's
#
# Or point verl at a running bubblespec deployment (`bubblespec ray up`, KubeRay) instead of
# starting ranks: +actor_rollout_ref.rollout.engine_kwargs.bubblespec.gateway=http://HOST:8000
# (the weights directory must then be visible to its ranks:
#  +actor_rollout_ref.rollout.engine_kwargs.bubblespec.weights_dir=/shared/bubblespec-weights).
set -x

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    data.train_batch_size=1024 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 `# bubblespec` \
    actor_rollout_ref.rollout.name=bubblespec `# bubblespec` \
    +actor_rollout_ref.rollout.agent.agent_loop_manager_class=bubblespec.integrations.verl.hook.BubbleSpecAgentLoopManager `# bubblespec` \
    +actor_rollout_ref.rollout.engine_kwargs.bubblespec.ranks=8 `# bubblespec` \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    algorithm.use_kl_in_reward=False \
    trainer.use_v1=False `# bubblespec` \
    trainer.critic_warmup=0 \
    trainer.logger=['console','wandb'] \
    trainer.project_name='verl_grpo_example_gsm8k' \
    trainer.experiment_name='qwen2_7b_function_rm' \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=15 $@
