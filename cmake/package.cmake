# The Debian package (`cpack` in the build folder): markbase_<version>_<arch>.deb with what `cmake --install`
# installs (bin/markbase and share/markbase/models/default) under /usr. Included last by CMakeLists.txt.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME markbase)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "MarkBase")
set(CPACK_PACKAGE_CONTACT "MarkBase maintainers <markbase@localhost>")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "MarkBase maintainers <markbase@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Gemma 4 inference engine (CLI and OpenAI-compatible server)")
# The binary is compiled with -march=native by default (MARKBASE_NATIVE): the package says so, since it runs
# only on CPUs like the one that built it. CPack puts the summary first and indents these lines as Debian's
# control file wants.
set(CPACK_PACKAGE_DESCRIPTION "MarkBase runs Google's Gemma 4 models from their Hugging Face checkpoint
folders: markbase run, chat, logits, inspect, bench, perplexity and serve (an OpenAI-compatible HTTP
server). It bundles a tiny Gemma 4 trained on public-domain English as its default model
(/usr/share/markbase/models/default). Built with MARKBASE_NATIVE=${MARKBASE_NATIVE} (ON: for the build
machine's CPU only); markbase --version lists the build settings.")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# markbase_0.1.0_amd64.deb rather than CPack's own markbase-0.1.0-Linux.deb
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# The shared libraries the binary links (libcpp-httplib0.11, libstdc++, ...) become the package's Depends
# through dpkg-shlibdeps (dpkg-dev); without it the package declares none, and says so here.
find_program(MARKBASE_DPKG_SHLIBDEPS dpkg-shlibdeps)
if(MARKBASE_DPKG_SHLIBDEPS)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
  # cuBLAS and NCCL often come from NVIDIA's installer rather than a Debian package: dpkg-shlibdeps is told
  # where they are, and CPack passes it --ignore-missing-info for libraries no package owns.
  if(MARKBASE_HAS_CUDA AND CUDAToolkit_LIBRARY_DIR)
    set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CUDAToolkit_LIBRARY_DIR})
  endif()
else()
  message(STATUS "MarkBase: no dpkg-shlibdeps (apt-get install dpkg-dev); the .deb will declare no Depends")
endif()
include(CPack)
