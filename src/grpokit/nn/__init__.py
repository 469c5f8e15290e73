"""What the rollout engines and the trainer both ask of a torch model besides loading it: CPU kernels
for its linear layers (kernels.py), a frozen copy and whether its attention is windowed (models.py),
Triton passes over its (rows, vocabulary) logits for sampling and the output layer (vocab.py).
Below rollout/ and train/ in the layers (tests/project/test_layering.py), so both import it."""
