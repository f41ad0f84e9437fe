# Warnings for the project's own targets. Third-party headers come in through imported targets, which CMake
# marks as SYSTEM includes, so their warnings stay out of the way.
add_library(tessera_warnings INTERFACE)
target_compile_options(tessera_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast -Wcast-align
  -Woverloaded-virtual -Wformat=2 -Wimplicit-fallthrough -Wmissing-declarations
  $<$<BOOL:${TESSERA_WERROR}>:-Werror>)
