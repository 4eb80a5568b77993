-- lumen: a LuaJIT tensor runtime with channels-last memory formats.
-- Install from a source checkout (luarocks make does not fetch source.url):
--    luarocks make rockspec/lumen-scm-1.rockspec                  (system tree)
--    luarocks make --tree /tmp/x rockspec/lumen-scm-1.rockspec    (a private tree)
-- The library needs LuaJIT (FFI); the `lumen` command starts luajit itself.
rockspec_format = "3.0"
package = "lumen"
version = "scm-1"

source = {
   -- a placeholder: there is no public repository; `luarocks make` builds the current directory
   url = "git://example.invalid/lumen",
}

description = {
   summary = "Strided tensors with PyTorch's memory formats (channels-last) for LuaJIT",
   detailed = [[
lumen is a tensor runtime: a C core (strided tensors with contiguous, channels_last and
channels_last_3d layouts, elementwise/reduction/convolution kernels) used from LuaJIT through
the FFI, with autograd, nn modules, optimizers and torchvision-compatible models in Lua.]],
   license = "MIT",
   labels = { "tensor", "deep-learning", "luajit", "ffi" },
}

-- the same runtime dependencies as lumen-0.1.0-1.rockspec: lua-cjson (JSON of safetensors
-- headers and checkpoints; serialize.lua also takes dkjson) and argparse (the example scripts'
-- flags). With the distribution's packages instead (apt-get install lua-cjson lua-argparse),
-- which luarocks does not know about, build offline with `luarocks make --deps-mode=none ...`
-- (.ci/run does).
dependencies = {
   "lua ~> 5.1",
   "lua-cjson >= 2.1",
   "argparse >= 0.6",
}

-- the C core reads gzip'd IDX files (zlib) and decodes JPEG and PNG images (lm.data.read_image)
external_dependencies = {
   ZLIB = { header = "zlib.h", library = "z" },
   JPEG = { header = "jpeglib.h", library = "jpeg" },
   PNG = { header = "png.h", library = "png" },
}

build = {
   type = "make",
   build_target = "all",
   build_variables = {
      CC = "$(CC)",
      -- no CUDA backend unless asked for: LUMEN_CUDA=1 luarocks make ... (make expands it)
      CUDA = "$(LUMEN_CUDA)",
      -- luarocks' CFLAGS carry -O2; the Makefile drops -O* when LUAROCKS_BUILD is set and keeps
      -- its own optimisation flags (OPT)
      CFLAGS = "$(CFLAGS) -I$(ZLIB_INCDIR) -I$(JPEG_INCDIR) -I$(PNG_INCDIR)",
      LDFLAGS = "-L$(ZLIB_LIBDIR) -L$(JPEG_LIBDIR) -L$(PNG_LIBDIR)",
      LUAROCKS_BUILD = "1",
   },
   install_target = "install",
   install_variables = {
      CUDA = "$(LUMEN_CUDA)",
      INST_PREFIX = "$(PREFIX)",
      INST_LIBDIR = "$(LIBDIR)",
      INST_LUADIR = "$(LUADIR)",
      INST_BINDIR = "$(BINDIR)",
   },
}

test = {
   type = "busted",
}
