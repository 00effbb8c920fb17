# Fashion-MNIST training takes minutes: only under `ctest -L long`.
set_tests_properties(${name} PROPERTIES LABELS long TIMEOUT 1800)
