# -DTESSERA_SANITIZE=ON (the "asan" preset): AddressSanitizer + UndefinedBehaviorSanitizer on every target.
if(TESSERA_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
