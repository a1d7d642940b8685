"""What the tests share: helpers, stand-ins and the independent reference client. Test modules import from here
(and from autotune), never from each other; the instruments benchmarks use too are in autotune.testing."""
