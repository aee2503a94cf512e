"""Public to the terminal commands here and in bench/: load the engine synchronously, with
progress on stderr."""

from chat.infra.runtime import runtime


def load(command):
    from chat.engine.local.loader import load_backend

    return load_backend(runtime.engine_config(), progress=lambda line: command.stderr.write(line))
