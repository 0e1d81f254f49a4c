"""Contract fuzzing of the reference plugins through their real executables
(`test_fuzz_contract`), with the strategies (`strategies`) and the "what is
there" snapshots (`snapshot`) it uses; `make fuzz` runs the long version."""
