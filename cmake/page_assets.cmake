# The page of `deloco report` and of the live dashboard, src/report/web/ (report.html, the template; report.js;
# report.css), compiled into src/report/report.cpp as raw strings (cmake/embed_text.cmake) so the files stay plain
# HTML, JavaScript and CSS. deloco_embed_page(TARGET...) generates page_report_{html,js,css}.inc into the calling
# directory's build folder (once per directory) and lets each TARGET, which compiles report.cpp, include them.
function(deloco_embed_page)
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/generated)
  set(incs)
  foreach(asset report.html report.js report.css)
    string(REGEX REPLACE "[^A-Za-z]" "_" stem "page_${asset}")
    set(in ${PROJECT_SOURCE_DIR}/src/report/web/${asset})
    set(out ${dir}/${stem}.inc)
    add_custom_command(OUTPUT ${out}
                       COMMAND ${CMAKE_COMMAND} -DIN=${in} -DOUT=${out} -P ${PROJECT_SOURCE_DIR}/cmake/embed_text.cmake
                       DEPENDS ${in} ${PROJECT_SOURCE_DIR}/cmake/embed_text.cmake
                       COMMENT "Embedding src/report/web/${asset}")
    list(APPEND incs ${out})
  endforeach()
  foreach(target ${ARGN})
    target_sources(${target} PRIVATE ${incs})
    target_include_directories(${target} PRIVATE ${dir})
  endforeach()
endfunction()
