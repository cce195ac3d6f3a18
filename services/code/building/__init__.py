"""Programs in compiled languages, on the server's side: ``cache`` (the compile cache, one build
per distinct source), ``sandboxed_build`` (a build run in the sandbox, held while its runs use
it). What runs inside the sandbox is ``sandbox.inside.compiled_programs``."""
