# test_models loads a checkpoint that apex-train writes during the test (tools/ is added after tests/:
# the generator expression and the dependency resolve once every target exists).
if(EXISTS ${PROJECT_SOURCE_DIR}/tools/CMakeLists.txt)
  set_property(TEST test_models APPEND PROPERTY ENVIRONMENT "APEX_TRAIN=$<TARGET_FILE:apex-train>")
  add_dependencies(test_models apex-train)
endif()
