"""The live page on the admin port: ``GET /ui`` and the state it polls."""
