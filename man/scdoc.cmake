# cmake -DSCDOC= -DINPUT= -DOUTPUT= -P scdoc.cmake: scdoc < INPUT > OUTPUT,
# leaving no OUTPUT behind when scdoc fails.
execute_process(COMMAND ${SCDOC} INPUT_FILE ${INPUT} OUTPUT_FILE ${OUTPUT}.tmp
                ERROR_VARIABLE errors RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(REMOVE ${OUTPUT}.tmp)
  message(FATAL_ERROR "scdoc ${INPUT}: ${errors}")
endif()
file(RENAME ${OUTPUT}.tmp ${OUTPUT})
