"""bubblespec as a verl 0.9 rollout backend: `actor_rollout_ref.rollout.name=bubblespec`.

Importing `plugin` registers the backend with verl, under the name `bubblespec`:

- `RolloutReplicaRegistry` -> `replica.BubbleSpecReplica` (the driver side: starts the
  cluster and the one `server.BubbleSpecServer` actor that verl's load balancer routes
  `generate` calls to);
- verl's rollout adapter table -> `adapter.BubbleSpecServerAdapter` (the trainer-worker
  side: weight sync by checkpoint directory).

verl imports it by itself through the `verl.plugins` entry point that bubblespec's package
declares (`pip install bubblespec[verl]`), or with `VERL_USE_EXTERNAL_MODULES=
bubblespec.integrations.verl.plugin`. The next-batch hook is verl's own setting
`actor_rollout_ref.rollout.agent.agent_loop_manager_class=
bubblespec.integrations.verl.hook.BubbleSpecAgentLoopManager`.

Modules: `settings` (the plugin's settings in verl's config), `batcher` (generate calls
-> rollout steps), `server` (the Ray server actor), `replica`, `adapter`, `hook`, `plugin`.
`settings` and `batcher` import neither verl nor Ray.
"""

