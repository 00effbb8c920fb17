# About 0.6 GB of logits, probabilities and gradients: only under `ctest -L long`.
set_tests_properties(${name} PROPERTIES LABELS long)
