/* The tunnels page (being built). */
"use strict";
