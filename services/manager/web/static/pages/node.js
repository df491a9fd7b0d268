/* The node page (being built). */
"use strict";
