// Preloaded into Node test peers (NODE_OPTIONS=--require): every server they start listens on
// 127.0.0.1 only, whatever address (or none) the program asks for.
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number" || (typeof args[0] === "string" && /^\d+$/.test(args[0]))) {
    if (typeof args[1] === "string") args[1] = "127.0.0.1";
    else args.splice(1, 0, "127.0.0.1");
  } else if (args[0] && typeof args[0] === "object" && args[0].port !== undefined) {
    args[0] = { ...args[0], host: "127.0.0.1" };
  }
  return listen.apply(this, args);
};
