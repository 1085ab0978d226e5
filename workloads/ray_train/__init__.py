"""What the Ray Train workloads share: run parameters, worker scaling, fitting a TorchTrainer, metrics and loss curve.

``config`` holds the pydantic models (importable without ray or torch), ``trainer`` builds
and fits the ``TorchTrainer`` and turns its errors into one line, ``metrics`` writes
``metrics.csv`` and ``loss_curve.png`` and prints the final metrics.
"""
