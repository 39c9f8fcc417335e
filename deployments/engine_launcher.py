"""Public alias: ``python -m deployments.engine_launcher -- COMMAND`` (see
``deployments.engine.launcher``, where the launcher lives)."""

from deployments.engine.launcher import main

if __name__ == "__main__":
    main()
