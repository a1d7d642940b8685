"""`python -m autotune.sim [SGLang launch_server flags] [--sim-* options]`: the SGLang emulator."""
from autotune.sim.startup import main

main()
