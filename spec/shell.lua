-- spec/shell.lua -- the shell and file helpers the specs that run commands share (quoting, a
-- command's output and status, whole-file reads). It loads nothing of lumen, so specs that check
-- where lumen was loaded from (install_spec) can use it too.
local M = {}

-- s quoted for sh
function M.q(s)
   return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- run a shell command; returns its output (stdout and stderr together) and exit status
function M.sh(cmd)
   local p = assert(io.popen("(" .. cmd .. ") 2>&1; echo \"__rc=$?\""))
   local out = p:read("*a")
   p:close()
   local rc = tonumber(out:match("__rc=(%d+)%s*$"))
   out = out:gsub("__rc=%d+%s*$", "")
   return out, rc
end

-- run a Lua chunk in a child luajit with this process's package paths (lines a library prints on
-- stderr, such as LUMEN_VERBOSE's, come back with it); env: "VAR=value ..." or nil. Returns its
-- output and exit status.
function M.luajit(code, env)
   local path = os.tmpname()
   local f = assert(io.open(path, "w"))
   f:write(("package.path = %q\npackage.cpath = %q\n"):format(package.path, package.cpath))
   f:write(code, "\n")
   f:close()
   local out, rc = M.sh((env and env .. " " or "") .. "luajit " .. M.q(path))
   os.remove(path)
   return out, rc
end

-- the whole file, or nil when it cannot be opened
function M.read_file(path)
   local f = io.open(path, "rb")
   if not f then return nil end
   local s = f:read("*a")
   f:close()
   return s
end

return M
