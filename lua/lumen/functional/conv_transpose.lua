local H = require("lumen.functional.common")
return H.F
