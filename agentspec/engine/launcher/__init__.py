"""What runs in the user's shell: ``agentspec serve`` (:mod:`~agentspec.engine.launcher.serve`),
whose ``--agentspec-*`` options are generated from :class:`~agentspec.engine.settings.EngineSettings`
(:mod:`~agentspec.engine.launcher.options`). It imports neither vLLM nor the draft index,
so the command's help is there in the base install."""
