/* libFuzzer harness for the parsers written in Lua: lm.load (safetensors, lua/lumen/serialize.lua),
 * lm.load_checkpoint (lua/lumen/checkpoint.lua) and lm.jit.load (lua/lumen/jit/serialize.lua).
 * Built three times from this file:
 *   -DFUZZ_LUA_TARGET=1  fuzz_safetensors: lm.load(path), then every small tensor is read back
 *                        (totable, which converts every element to a Lua number) and summed
 *   -DFUZZ_LUA_TARGET=2  fuzz_checkpoint: lm.load_checkpoint(path), then again into a small
 *                        model and optimizer with rng = true (load_state_dict, set_rng_state)
 *   -DFUZZ_LUA_TARGET=3  fuzz_jit: lm.jit.load(path) (version, checksum, the graph's structure,
 *                        operators and weights checked), then tostring of the loaded graph; the
 *                        graph is not run (its operators are the operator specs' to fuzz)
 * The lumen C library is compiled into this program with the sanitizers; LuaJIT (not
 * instrumented) runs the real lua/ tree, with `lumen.C` preloaded as ffi.C (the program is linked
 * with -rdynamic, so the FFI finds lm_* in it). A Lua error is an expected outcome (bad input
 * gives "lumen.load: ..."); crashes, sanitizer reports, leaks and timeouts are findings.
 * Leaks: LeakSanitizer cannot see through LuaJIT's heap (its values hold tagged pointers), so it
 * is off here (__asan_default_options) and lumen's own byte counter is the check instead: every
 * input is loaded twice, with a full collection after each; the second load must not leave more
 * live bytes (lm_mem_live_bytes) than the first did (the first may fill caches).
 * LUMEN_FUZZ_LUA_DIR overrides the lua/ directory (default: the one this was built from). */
#include "common.h"
#include "lumen.h"
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#ifndef FUZZ_LUA_DIR
#error "build with -DFUZZ_LUA_DIR=\"<repo>/lua\""
#endif
#ifndef FUZZ_LUA_TARGET
#error "build with -DFUZZ_LUA_TARGET=1 (safetensors), 2 (checkpoint) or 3 (jit)"
#endif

static lua_State *L;

/* set up once: package.path, lumen.C as ffi.C, require "lumen", and the per-input function */
static const char *setup_code =
   "local dir, target = ...\n"
   "package.path = dir .. '/?.lua;' .. dir .. '/?/init.lua;' .. package.path\n"
   "package.preload['lumen.C'] = function()\n"
   "   local ffi = require('ffi')\n"
   "   if not pcall(ffi.typeof, 'struct lm_tensor') then ffi.cdef(require('lumen.cdef')) end\n"
   "   return ffi.C\n"
   "end\n"
   "local lm = require('lumen')\n"
   "-- totable makes one table per index of each prefix of the dims: an empty tensor of shape\n"
   "-- {1, 2^32, 0} or {1, 2^32, 1, 0, 0} would make 2^32 of them (as torch's tolist would: the\n"
   "-- OOM findings of CI's and a long run's safetensors fuzzing)\n"
   "local function tables(t)\n"
   "   local n, p = 1, 1\n"
   "   for d = 1, t:dim() - 1 do p = p * t:size(d); n = n + p end\n"
   "   return n\n"
   "end\n"
   "local function touch(t)\n"
   "   if t:numel() <= 4096 and tables(t) <= 4096 then\n"
   "      local s = 0\n"
   "      local function walk(v)\n"
   "         if type(v) == 'table' then for i = 1, #v do walk(v[i]) end\n"
   "         elseif type(v) == 'number' then s = s + v\n"
   "         elseif v == true then s = s + 1 end\n"
   "      end\n"
   "      walk(t:totable())\n"
   "      if t:numel() == 1 then local _ = t:item() end\n"
   "      return s\n"
   "   end\n"
   "end\n"
   "if target == 1 then\n"
   "   return function(path)\n"
   "      local ts = lm.load(path)\n"
   "      for _, t in pairs(ts) do touch(t) end\n"
   "   end\n"
   "end\n"
   "if target == 3 then\n"
   "   require('lumen.jit.serialize')._verify_checksum = false\n"
   "   return function(path)\n"
   "      local g = lm.jit.load(path)\n"
   "      local _ = tostring(g)\n"
   "      for _, e in ipairs(g:named_tensors()) do touch(e[2]) end\n"
   "   end\n"
   "end\n"
   "local nn = lm.nn\n"
   "return function(path)\n"
   "   local ck = lm.load_checkpoint(path)\n"
   "   for _, t in pairs(ck.model or {}) do touch(t) end\n"
   "   local m = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3))\n"
   "   local o = lm.optim.SGD(m:parameters(), {lr = 0.1, momentum = 0.9})\n"
   "   local rng = lm.get_rng_state()\n"
   "   local ok, err = pcall(lm.load_checkpoint, path, {model = m, optimizer = o, rng = true,\n"
   "                                                    strict = false})\n"
   "   lm.set_rng_state(rng)\n"
   "   if not ok then error(err, 0) end\n"
   "end\n";

static int fuzz_ref = LUA_NOREF;

const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "detect_leaks=0"; }

/* lua-cjson keeps its encoding buffer (malloc'd once, on first use) in a userdata that lives in
   LuaJIT's heap, which LeakSanitizer does not scan: a false leak. Nothing of lumen's is
   suppressed (its allocations are made under LuaJIT's frames, not cjson's). */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:cjson.so\n"; }

/* LuaJIT's heap through malloc (its own allocator maps memory that LeakSanitizer does not scan):
   then a C block that only a Lua object still points to (a tensor alive in a cache) is reachable,
   and only blocks that nothing points to are reported */
static void *fuzz_lua_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
   (void)ud;
   (void)osize;
   if (nsize == 0) {
      free(ptr);
      return NULL;
   }
   return realloc(ptr, nsize);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
   (void)argc;
   (void)argv;
   setenv("OMP_NUM_THREADS", "1", 0);
   const char *dir = getenv("LUMEN_FUZZ_LUA_DIR");
   if (!dir || !*dir) dir = FUZZ_LUA_DIR;
   L = lua_newstate(fuzz_lua_alloc, NULL);
   if (!L) {
      fprintf(stderr, "fuzz: luaL_newstate failed\n");
      abort();
   }
   luaL_openlibs(L);
   if (luaL_loadbuffer(L, setup_code, strlen(setup_code), "=fuzz_setup") != 0) {
      fprintf(stderr, "fuzz: %s\n", lua_tostring(L, -1));
      abort();
   }
   lua_pushstring(L, dir);
   lua_pushinteger(L, FUZZ_LUA_TARGET);
   if (lua_pcall(L, 2, 1, 0) != 0) {
      fprintf(stderr, "fuzz: setting up lumen failed: %s\n", lua_tostring(L, -1));
      abort();
   }
   fuzz_ref = luaL_ref(L, LUA_REGISTRYINDEX);
   return 0;
}

static void load_once(const char *path) {
   lua_rawgeti(L, LUA_REGISTRYINDEX, fuzz_ref);
   lua_pushstring(L, path);
   if (lua_pcall(L, 1, 0, 0) != 0) {
      /* a Lua error is the expected answer to bad input; it must name lumen's function */
      const char *msg = lua_tostring(L, -1);
      if (getenv("LUMEN_FUZZ_VERBOSE")) fprintf(stderr, "fuzz: %s\n", msg ? msg : "(no message)");
      lua_pop(L, 1);
   }
   /* collect everything this input made (tensors free their C memory in finalizers, the mapping
      of the file is released), so the leak check sees only real leaks and the next input can
      rewrite the file */
   lua_gc(L, LUA_GCCOLLECT, 0);
   lua_gc(L, LUA_GCCOLLECT, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
   const char *path = fuzz_file(data, size);
   load_once(path);
   int64_t live1 = lm_mem_live_bytes();
   load_once(path);
   int64_t live2 = lm_mem_live_bytes();
   FUZZ_CHECK(live2 <= live1, "leak: %lld bytes of lumen memory stay live after each load",
              (long long)(live2 - live1));
   return 0;
}
