# test_gpt_hf's live part trains and exports with apex-train and runs tests/gpt2_hf_live.py (tools/ is
# added after tests/: the generator expression and the dependency resolve once every target exists).
set_property(TEST test_gpt_hf APPEND PROPERTY ENVIRONMENT "APEX_TEST_SRC=${CMAKE_CURRENT_SOURCE_DIR}")
if(EXISTS ${PROJECT_SOURCE_DIR}/tools/CMakeLists.txt)
  set_property(TEST test_gpt_hf APPEND PROPERTY ENVIRONMENT "APEX_TRAIN=$<TARGET_FILE:apex-train>")
  add_dependencies(test_gpt_hf apex-train)
endif()
