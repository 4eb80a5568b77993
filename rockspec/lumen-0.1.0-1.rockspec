-- lumen 0.1.0: the released rock. `luarocks install lumen` (once published) fetches the tag
-- v0.1.0 and builds it with the Makefile; from a source checkout use lumen-scm-1.rockspec with
-- `luarocks make`. The library needs LuaJIT (FFI): the `lumen` command starts luajit itself, and
-- require("lumen") under PUC Lua stops with "lumen requires LuaJIT (found Lua 5.x)".
rockspec_format = "3.0"
package = "lumen"
version = "0.1.0-1"

source = {
   -- the organisation is a placeholder until the public repository exists
   url = "git+https://github.com/lumen-tensor/lumen.git",
   tag = "v0.1.0",
}

description = {
   summary = "Strided tensors with PyTorch's memory formats (channels-last) for LuaJIT",
   detailed = [[
lumen is a tensor runtime: a C core (strided tensors with contiguous, channels_last and
channels_last_3d layouts, elementwise/reduction/convolution kernels) used from LuaJIT through
the FFI, with autograd, nn modules, optimizers and torchvision-compatible models in Lua.]],
   homepage = "https://github.com/lumen-tensor/lumen",
   license = "MIT",
   labels = { "tensor", "deep-learning", "luajit", "ffi" },
}

-- LuaJIT is a Lua 5.1 (its modules install into the 5.1 tree). A "luajit" dependency cannot be
-- declared: a luarocks configured for PUC Lua 5.1 (Debian's) would refuse it although the rock
-- works there, because bin/lumen starts luajit. lua-cjson reads and writes the JSON of
-- safetensors headers and checkpoints (serialize.lua also accepts dkjson when cjson is absent);
-- argparse parses the example scripts' flags (lumen.util.parse_flags).
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
